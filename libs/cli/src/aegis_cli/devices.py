"""MQTT device identity: the broker's password file and ACL file, managed by ``aegis devices``.

Every client of the production broker has a user name and a random password. Its role decides what
the ACL lets it do, and the ACL is what makes the topic's factory id trustworthy:

* ``factory``: publish only to ``aegis/{its own id}/+`` (telemetry and upload requests), and
  read only ``aegis/{its own id}/upload_url/+`` (the answers to its upload requests, which carry
  presigned uploads into its own prefix: no other identity may read them);
* ``ingest``: subscribe to ``aegis/+/+`` (shared subscriptions included), and publish only the
  answers to upload requests, ``aegis/+/upload_url/+``;
* ``monitor``: subscribe to ``$SYS/#`` (the cloud collector's broker statistics).

An ACL written by an older version lacks the upload lines: ``aegis devices sync`` rewrites it
from the roles it records.

The password file uses Mosquitto's own format, ``user:$7$iterations$salt$hash`` (PBKDF2-HMAC-SHA512,
base64), written here with hashlib rather than by running ``mosquitto_passwd``, whose batch mode
takes the password as a command-line argument that every local user can read in the process list.
The passwords are 192 random bits, so the iteration count (mosquitto_passwd's 101) is not what
protects them; it keeps each broker login cheap.

The files are replaced atomically under a lock; the broker reads them again on SIGHUP.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import os
import secrets
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from aegis_contracts.errors import ContractError
from aegis_contracts.ids import TOPIC_ROOT, validate_factory_id
from aegis_contracts.keys import CLOUD_INFRA_TARGET
from aegis_contracts.uploads import UPLOAD_URL

PBKDF2_ITERATIONS = 101
SALT_BYTES = 12
PASSWORD_BYTES = 24  # 192 bits, 32 URL-safe characters
ACL_HEADER = (
    "# AEGIS broker ACL, written by `aegis devices`: change it with the tool, not by hand.\n"
    "# Anything not allowed here is denied (the broker's default once an acl_file is set).\n"
)


class Role(StrEnum):
    FACTORY = "factory"
    INGEST = "ingest"
    MONITOR = "monitor"


class DeviceError(ValueError):
    """A refused device operation; the message says why."""


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    role: Role

    def acl(self) -> list[str]:
        """The ACL lines of this client (Mosquitto's ``user`` / ``topic`` syntax)."""
        if self.role is Role.FACTORY:
            topics = [
                f"topic write {TOPIC_ROOT}/{self.name}/+",
                f"topic read {TOPIC_ROOT}/{self.name}/{UPLOAD_URL}/+",
            ]
        elif self.role is Role.INGEST:
            topics = [f"topic read {TOPIC_ROOT}/+/+", f"topic write {TOPIC_ROOT}/+/{UPLOAD_URL}/+"]
        else:
            topics = ["topic read $SYS/#"]
        return [f"user {self.name}", f"# role {self.role.value}", *topics]


# the client ids of AEGIS's own services start with this (aegis-ingest-{host}, ...): no device
# may be named so, since a device's client id is its name
SERVICE_PREFIX = "aegis-"


def validate_name(name: str, role: Role) -> str:
    """A client name is a factory id (the same allow-list as topics and keys: no ``/``, ``+``,
    ``#``, ``:``, spaces, unicode look-alikes); ``cloud-infra`` and, for devices, names that
    start with ``aegis-`` (the services' client ids) are reserved."""
    try:
        validate_factory_id(name)
    except ContractError as err:
        raise DeviceError(str(err)) from None
    if role is Role.FACTORY and name == CLOUD_INFRA_TARGET:
        raise DeviceError(f"{name!r} is reserved (the cloud report target and alert scope)")
    if role is Role.FACTORY and name.startswith(SERVICE_PREFIX):
        raise DeviceError(
            f"{name!r} is reserved: device names may not start with {SERVICE_PREFIX!r} "
            "(the client ids of AEGIS's services)"
        )
    return name


def hash_password(
    password: str, *, salt: bytes | None = None, iterations: int = PBKDF2_ITERATIONS
) -> str:
    """Mosquitto's ``$7$`` password hash of ``password``."""
    salt = salt if salt is not None else secrets.token_bytes(SALT_BYTES)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    b64 = base64.b64encode
    return f"$7${iterations}${b64(salt).decode()}${b64(digest).decode()}"


def verify_password(password: str, encoded: str) -> bool:
    """True when ``encoded`` (a ``$7$`` hash) is the hash of ``password``."""
    parts = encoded.split("$")
    if len(parts) != 5 or parts[1] != "7":
        return False
    salt, want = base64.b64decode(parts[3]), base64.b64decode(parts[4])
    got = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, int(parts[2]))
    return hmac.compare_digest(got, want)


class DeviceRegistry:
    """The password files and the ACL file of one broker.

    Devices (role ``factory``) are in ``password_file``, which the broker's device listener
    reads, where each client's id is its user name (``use_username_as_clientid``): a device can
    never take another client's id. AEGIS's services (``ingest``, ``monitor``) are in
    ``{password_file}-services``, read only by the services' listener, where they keep their own
    client ids (one per replica). Neither kind can log in on the other's listener."""

    def __init__(self, password_file: Path, acl_file: Path) -> None:
        self.password_file = password_file
        self.services_password_file = password_file.with_name(password_file.name + "-services")
        self.acl_file = acl_file

    def devices(self) -> list[Device]:
        """Every client, by name (the ACL says the role; the password file says it exists)."""
        hashes = self._hashes()
        return [d for d in self._acl_devices() if d.name in hashes]

    def add(self, name: str, role: Role) -> str:
        """Register ``name`` with a new random password; returns that password (shown once)."""
        validate_name(name, role)
        with self._locked():
            hashes = self._hashes()
            if name in hashes:
                raise DeviceError(
                    f"{name!r} exists already: revoke it first to issue a new password"
                )
            password = secrets.token_urlsafe(PASSWORD_BYTES)
            hashes[name] = hash_password(password)
            devices = [d for d in self._acl_devices() if d.name != name] + [Device(name, role)]
            self._write(hashes, devices)
        return password

    def sync(self) -> list[Device]:
        """Rewrite the ACL from the roles it records (what each role may do now); the
        passwords are untouched. Returns the clients it holds."""
        with self._locked():
            hashes = self._hashes()
            devices = self._acl_devices()
            self._write(hashes, devices)
        return [d for d in devices if d.name in hashes]

    def revoke(self, name: str) -> Device:
        """Remove ``name`` from both files; its next login (after the broker reloads) fails."""
        with self._locked():
            hashes = self._hashes()
            known = {d.name: d for d in self._acl_devices()}
            if name not in hashes and name not in known:
                raise DeviceError(f"no device {name!r}")
            hashes.pop(name, None)
            gone = known.pop(name, Device(name, Role.FACTORY))
            self._write(hashes, list(known.values()))
        return gone

    # -- files -----------------------------------------------------------------------------------

    def _hashes(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for file in (self.password_file, self.services_password_file):
            if not file.exists():
                continue
            for line in file.read_text().splitlines():
                name, sep, encoded = line.partition(":")
                if sep and name and not line.startswith("#"):
                    found[name] = encoded
        return found

    def _acl_devices(self) -> list[Device]:
        if not self.acl_file.exists():
            return []
        found: list[Device] = []
        name: str | None = None
        for line in self.acl_file.read_text().splitlines():
            if line.startswith("user "):
                name = line.removeprefix("user ").strip()
            elif line.startswith("# role ") and name is not None:
                try:
                    found.append(Device(name, Role(line.removeprefix("# role ").strip())))
                except ValueError:
                    raise DeviceError(f"{self.acl_file}: unknown role in {line!r}") from None
                name = None
        return found

    def _write(self, hashes: dict[str, str], devices: list[Device]) -> None:
        ordered = sorted(devices, key=lambda d: d.name)
        blocks = ["\n".join(d.acl()) for d in ordered]
        _replace(self.acl_file, ACL_HEADER + "".join(f"\n{b}\n" for b in blocks), 0o644)
        services = {d.name for d in devices if d.role is not Role.FACTORY}
        for file, names in (
            (self.password_file, sorted(set(hashes) - services)),
            (self.services_password_file, sorted(set(hashes) & services)),
        ):
            _replace(file, "".join(f"{n}:{hashes[n]}\n" for n in names), 0o640)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.password_file.parent.mkdir(parents=True, exist_ok=True)
        lock = self.password_file.with_name(self.password_file.name + ".lock")
        with lock.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _replace(path: Path, text: str, mode: int) -> None:
    """Write ``path`` whole or not at all (a broker reloading mid-write never reads half a file).

    An existing file keeps its mode and owner (e.g. ``root:mosquitto 0640`` set once by the
    operator); a new one gets ``mode``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.stat() if path.exists() else None
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, old.st_mode & 0o777 if old else mode)
        if old is not None:
            with contextlib.suppress(PermissionError):
                os.chown(tmp, old.st_uid, old.st_gid)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
