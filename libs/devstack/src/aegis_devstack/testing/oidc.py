"""A real OpenID Connect provider (panva's ``oidc-provider`` on Node.js) for the
dashboard's sign-in tests, not a mock: discovery, PKCE, signed ID tokens, userinfo, sign-out.

Its script and locked dependencies are ``libs/devstack/oidc-provider/``; the first use installs
them (``npm ci``) into ``.cache/oidc-provider/{digest}/`` under the checkout (gitignored), once
for every pytest-xdist worker (a file lock), again only when the script or the lock changes.

``running_provider(client=..., users=[...], ttl={...})`` starts one on a free port of 127.0.0.1,
waits for its discovery document, and stops it (its process ended, its log folder removed) when
the block ends: a test module shares one (each test's browser has its own cookies, so its
sessions are its own). A test signs a user in over HTTP, without a browser:
:meth:`OidcProvider.sign_in` follows the authorization request to the provider's sign-in form,
posts the account id (consent is granted at once) and returns the redirect back to the client.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urljoin

import httpx

from aegis_devstack.localservers import LocalServerError, ManagedServer, free_port
from aegis_devstack.localservers import start_managed_server as _start_managed_server

__all__ = ["OidcClient", "OidcProvider", "OidcUser", "install_provider", "running_provider"]

SOURCE = Path(__file__).resolve().parents[3] / "oidc-provider"
SCRIPT_FILES = ("package.json", "package-lock.json", "provider.mjs")
# under the checkout (the workspace members are installed editable), never the machine's /tmp
CACHE = Path(__file__).resolve().parents[5] / ".cache" / "oidc-provider"
STAMP = ".installed"
NPM_TIMEOUT_S = 300
# a start is under a second on a quiet machine (loading oidc-provider's modules, an RSA key);
# the suite's busiest minutes, two workers beside whole stacks, have stretched it past 30 s
START_TIMEOUT_S = 90


@dataclass(frozen=True)
class OidcClient:
    """The relying party the provider knows (the dashboard)."""

    client_id: str = "aegis-dashboard"
    client_secret: str = "dashboard-secret"  # noqa: S105 - a test client's
    redirect_uris: Sequence[str] = ()
    post_logout_redirect_uris: Sequence[str] = ()


@dataclass(frozen=True)
class OidcUser:
    """An account: its id is what the sign-in form takes and the ``sub`` of its tokens."""

    account_id: str
    name: str
    email: str = ""
    groups: Sequence[str] = ()


@dataclass
class OidcProvider:
    issuer: str
    client: OidcClient
    users: Sequence[OidcUser]
    server: ManagedServer = field(repr=False)

    @property
    def discovery_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"

    def stop(self) -> None:
        self.server.close()

    async def sign_in(
        self, http: httpx.AsyncClient, authorization_url: str, account_id: str
    ) -> str:
        """Sign ``account_id`` in as a browser would: follow ``authorization_url`` (the client's
        redirect to the provider) to the sign-in form, post the account id, follow the provider
        (consent is automatic) until it sends the browser back to one of the client's redirect
        URIs: that URL (``…/callback?code=…&state=…``). ``http`` keeps the provider's cookies
        (its session: a second sign-in with it needs no form)."""
        url, posted = authorization_url, False
        for _ in range(10):
            if url.startswith(tuple(self.client.redirect_uris)):
                return url
            response = await http.get(url)
            if response.status_code == 200 and "/interaction/" in url and not posted:
                response = await http.post(f"{url}/login", data={"login": account_id})
                posted = True
            if response.status_code not in (302, 303):
                raise AssertionError(
                    f"the provider answered {response.status_code} at {response.request.url}: "
                    f"{response.text[:500]}"
                )
            url = urljoin(str(response.request.url), response.headers["location"])
        raise AssertionError(f"the provider never sent the browser back to the client: {url}")


def _digest() -> str:
    sha = hashlib.sha256()
    for name in SCRIPT_FILES:
        sha.update(name.encode() + b"\0" + (SOURCE / name).read_bytes() + b"\0")
    return sha.hexdigest()[:16]


def install_provider() -> Path:
    """The folder holding the provider's script and its ``node_modules``: installed with
    ``npm ci`` from the lock on first use (under a lock file: workers starting at once install
    it once), again when the script or the lock changed. Another digest's folder is removed."""
    if not (SOURCE / "package-lock.json").is_file():
        raise LocalServerError(
            f"{SOURCE} is missing: the oidc provider is found from a source checkout "
            "(the workspace installed editable, as `make install` does)"
        )
    npm = shutil.which("npm")
    if npm is None:
        raise LocalServerError("npm is not installed: the oidc provider needs Node.js 20.19+")
    digest = _digest()
    folder = CACHE / digest
    if (folder / STAMP).is_file():
        return folder
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (folder / STAMP).is_file():  # another worker installed it meanwhile
            return folder
        for old in CACHE.iterdir():
            if old.is_dir() and old.name != "npm-cache":
                shutil.rmtree(old)
        folder.mkdir()
        for name in SCRIPT_FILES:
            shutil.copyfile(SOURCE / name, folder / name)
        _npm_ci(npm, folder)
        (folder / STAMP).write_text(digest)
    return folder


def _npm_ci(npm: str, folder: Path) -> None:
    # npm's cache and temporary files stay under .cache too: nothing in the run's TMPDIR
    scratch = CACHE / "npm-tmp"
    scratch.mkdir(exist_ok=True)
    env = os.environ | {
        "npm_config_cache": str(CACHE / "npm-cache"),
        "npm_config_update_notifier": "false",
        "TMPDIR": str(scratch),
    }
    try:
        done = subprocess.run(  # noqa: S603 - fixed argv, no shell
            [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=NPM_TIMEOUT_S,
            check=False,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if done.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise LocalServerError(f"npm ci of the oidc provider failed in {folder}:\n{done.stderr}")


def _discovery_answers(issuer: str) -> bool:
    url = f"{issuer}/.well-known/openid-configuration"
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:  # noqa: S310 - our own http URL
            document = json.load(response)
    except (OSError, ValueError):
        return False
    return isinstance(document, dict) and document.get("issuer") == issuer


def start_provider(
    *, client: OidcClient, users: Sequence[OidcUser], ttl: Mapping[str, int] | None = None
) -> OidcProvider:
    """A provider on a free port of 127.0.0.1, once its discovery document answers. ``ttl``:
    oidc-provider's lifetimes in seconds by name (``IdToken``, ``Session``, ``Interaction``...)."""
    folder = install_provider()
    node = shutil.which("node")
    if node is None:
        raise LocalServerError("node is not installed: the oidc provider needs Node.js 20.19+")
    port = free_port()
    issuer = f"http://127.0.0.1:{port}"
    config = {
        "port": port,
        "issuer": issuer,
        "clients": [
            {
                **asdict(client),
                "redirect_uris": list(client.redirect_uris),
                "post_logout_redirect_uris": list(client.post_logout_redirect_uris),
            }
        ],
        "users": [{**asdict(user), "groups": list(user.groups)} for user in users],
        "ttl": dict(ttl or {}),
    }
    scratch = Path(tempfile.mkdtemp(prefix=f"aegis-oidc-{port}-"))
    try:
        server = _start_managed_server(
            issuer,
            [node, str(folder / "provider.mjs"), json.dumps(config)],
            scratch / "provider.log",
            _discovery_answers,
            START_TIMEOUT_S,
            scratch=scratch,
        )
    except LocalServerError as err:
        log = (scratch / "provider.log").read_text(errors="replace")[-2000:]
        shutil.rmtree(scratch, ignore_errors=True)
        raise LocalServerError(f"the oidc provider did not start: {err}\n{log}") from err
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return OidcProvider(issuer, client, tuple(users), server)


@contextlib.contextmanager
def running_provider(
    *, client: OidcClient, users: Sequence[OidcUser], ttl: Mapping[str, int] | None = None
) -> Iterator[OidcProvider]:
    provider = start_provider(client=client, users=users, ttl=ttl)
    try:
        yield provider
    finally:
        provider.stop()
