"""Passwords and the NATS server's ``authorization`` block for the bus's identities
(:mod:`aegis_contracts.bus` declares who may do what).

:func:`ensure_passwords` keeps one password per identity in a file (``aegis nats-auth``);
:func:`server_authorization` writes the ``authorization`` block of a nats-server config for given
passwords (bcrypt hashes, never the passwords), each identity with the permissions
:data:`aegis_contracts.bus.IDENTITIES` gives it.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

import bcrypt

from aegis_contracts.bus import ADMIN, IDENTITIES

# the NATS CLI's (`nats server passwd`); a server pays it again at every connection's check
BCRYPT_COST = 11
PASSWORD_BYTES = 24  # 192 bits, 32 URL-safe characters


def hash_password(password: str, cost: int = BCRYPT_COST) -> str:
    """A bcrypt hash nats-server accepts in place of a password."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()


def server_authorization(passwords: Mapping[str, str], *, cost: int = BCRYPT_COST) -> str:
    """The ``authorization`` block of a nats-server config: ``admin`` (may do anything) and each
    identity of ``passwords`` that :data:`IDENTITIES` knows, with its permissions. Values are
    JSON, which the NATS config format reads as is. ``cost``: bcrypt's (4 to 31); a server pays
    it again at every connection's check."""
    users = []
    for name, password in sorted(passwords.items()):
        user: dict[str, object] = {"user": name, "password": hash_password(password, cost)}
        if name != ADMIN:
            if name not in IDENTITIES:
                raise KeyError(
                    f"no NATS identity {name!r} (known: {', '.join(sorted(IDENTITIES))})"
                )
            user["permissions"] = IDENTITIES[name].permissions()
        users.append(user)
    body = ",\n    ".join(json.dumps(u) for u in users)
    return f"authorization {{\n  users: [\n    {body}\n  ]\n}}\n"


def ensure_passwords(path: Path) -> dict[str, str]:
    """The passwords of ``path``: ``name=password`` lines (an env file, which
    ``kubectl create secret generic --from-env-file`` makes one key per identity of). Those of
    ``admin`` and of every identity the file lacks are made up and added; the file is written
    mode 0600 when it changes. An unknown name is refused (a typo would lock a service out)."""
    passwords: dict[str, str] = {}
    if path.exists():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            name, sep, password = line.partition("=")
            name = name.strip()
            if not sep or not password or (name != ADMIN and name not in IDENTITIES):
                raise ValueError(f"{path}:{number}: not a NATS identity's name=password line")
            passwords[name] = password
    missing = [n for n in (ADMIN, *IDENTITIES) if n not in passwords]
    if missing:
        for name in missing:
            passwords[name] = secrets.token_urlsafe(PASSWORD_BYTES)
        text = "".join(f"{name}={password}\n" for name, password in passwords.items())
        fresh = path.with_name(f".{path.name}.new")
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(text)
        fresh.replace(path)
    return passwords
