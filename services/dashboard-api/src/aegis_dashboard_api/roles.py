"""The roles file (``AEGIS_OIDC_ROLES_FILE``): which of the provider's groups get which role and
factories, and :func:`identity_from_claims`, the person a signed-in provider's claims make. Pure.

```toml
groups_claim = "groups"        # the claim that lists a person's groups (default "groups")

[[rule]]
group = "aegis-admins"
role = "admin"

[[rule]]
group = "plant-north-ops"
role = "responder"
factories = ["north-*"]
```

A person in several groups gets the highest role of their rules and every factory of them; a
person in none is not let in (None).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from aegis_contracts.people import Identity, Role, parse_scope

_RANK = {Role.VIEWER: 0, Role.RESPONDER: 1, Role.ADMIN: 2}
NAME_MAX = 256


class RoleRule(BaseModel):
    """Members of ``group`` get ``role`` on ``factories`` (ids or patterns; ``*``: the fleet)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    group: str = Field(min_length=1)
    role: Role
    factories: tuple[str, ...] = ()

    @field_validator("factories", mode="before")
    @classmethod
    def _factories(cls, value: object) -> tuple[str, ...]:
        if isinstance(value, str | list | tuple):
            return parse_scope(value)
        raise ValueError("factories is a list of factory ids or patterns")


class RoleMapping(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    groups_claim: str = Field(default="groups", min_length=1)
    rules: tuple[RoleRule, ...] = Field(default=(), alias="rule")


class RolesFileError(ValueError):
    """The roles file is missing or wrong; the message names the file and what is wrong."""


def parse_roles(text: str, *, source: str = "the roles file") -> RoleMapping:
    """A :class:`RoleMapping` from the roles file's TOML; :class:`RolesFileError` when it is not
    TOML, has a key it does not know, or a rule with a role or factory that is not one."""
    try:
        return RoleMapping.model_validate(tomllib.loads(text))
    except tomllib.TOMLDecodeError as err:
        raise RolesFileError(f"{source} is not TOML: {err}") from None
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()
        )
        raise RolesFileError(f"{source}: {problems}") from None


def load_roles(path: Path) -> RoleMapping:
    try:
        text = path.read_text()
    except OSError as err:
        raise RolesFileError(f"the roles file {path} cannot be read: {err}") from None
    return parse_roles(text, source=str(path))


def groups_of(claims: dict[str, Any], claim: str) -> list[str]:
    """The groups a claim lists (a list of strings; one string is one group; anything else: none)."""
    value = claims.get(claim)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [group for group in value if isinstance(group, str)]
    return []


def identity_from_claims(claims: dict[str, Any], mapping: RoleMapping) -> Identity | None:
    """The identity of a person the provider signed in (its ID token's and userinfo's claims):
    ``sub`` as subject, a name (``name``, else ``preferred_username``, ``email``, ``sub``), the
    highest role of the rules their groups match and the union of those rules' factories. None
    when no rule matches, or ``sub`` is missing or longer than 256: such a person is not let in."""
    subject = claims.get("sub")
    if not isinstance(subject, str) or not 0 < len(subject) <= NAME_MAX:
        return None  # OpenID Connect's sub is at most 255 characters
    groups = set(groups_of(claims, mapping.groups_claim))
    matched = [rule for rule in mapping.rules if rule.group in groups]
    if not matched:
        return None
    role = max((rule.role for rule in matched), key=_RANK.__getitem__)
    scope = tuple(dict.fromkeys(entry for rule in matched for entry in rule.factories))
    return Identity(
        subject=subject,
        name=display_name(claims, subject),
        via="oidc",
        role=role,
        scope=scope,
    )


def display_name(claims: dict[str, Any], subject: str) -> str:
    for claim in ("name", "preferred_username", "email"):
        value = claims.get(claim)
        if isinstance(value, str) and value.strip():
            return value.strip()[:NAME_MAX]
    return subject[:NAME_MAX]
