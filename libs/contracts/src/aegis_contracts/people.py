"""People and what each may do: roles, factory scopes, identities and the one decision.

Every person (or wall screen) the dashboard serves is an :class:`Identity`: who (``subject``,
``name``), how they signed in (``via``), a :class:`Role` and a scope of factories. What an
identity may do to a factory is decided by :func:`decide`, and only there: the API's routes,
the live stream, the pages, reports, image links and incidents all ask it.

- **viewer**: reads the factories of its scope.
- **responder**: a viewer that also acknowledges and resolves incidents, and silences alerts,
  on the factories of its scope.
- **admin**: every factory, whatever its scope says, and what changes the platform: jobs,
  escalation policies, tokens, the audit record.

A scope is a list of factory ids or patterns (``plant-*``, ``site-?``: shell-style, matched
whole and case-sensitively, as factory ids are); ``*`` is the fleet. What belongs to no factory
(the cloud checks, fleet totals, the ``cloud-infra`` report) is read only with the fleet in
scope.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from aegis_contracts import keys
from aegis_contracts.keys import CLOUD_INFRA_TARGET

FLEET = "*"
# a scope entry: a factory id, or a pattern of one (``*`` and ``?`` wildcards)
_PATTERN = re.compile(r"[A-Za-z0-9*?][A-Za-z0-9_.*?-]{0,127}")


class Role(StrEnum):
    VIEWER = "viewer"
    RESPONDER = "responder"
    ADMIN = "admin"


class Act(StrEnum):
    """What a request does."""

    READ = "read"  # see a factory's data (or, for PLATFORM, what is the fleet's)
    RESPOND = "respond"  # acknowledge or resolve an incident
    SILENCE = "silence"  # create or end a silence
    ADMINISTER = "administer"  # jobs, escalation policies, tokens, the audit record


# the least role that may do each act (on a factory of its scope; admin: on every factory)
LEAST_ROLE: dict[Act, Role] = {
    Act.READ: Role.VIEWER,
    Act.RESPOND: Role.RESPONDER,
    Act.SILENCE: Role.RESPONDER,
    Act.ADMINISTER: Role.ADMIN,
}
_RANK = {Role.VIEWER: 0, Role.RESPONDER: 1, Role.ADMIN: 2}

Via = Literal["oidc", "token", "cli", "slack"]


def parse_scope(entries: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """A scope from ``a,plant-*`` or a list: each entry a factory id or pattern; a ValueError
    naming the entry that is neither. An empty scope is allowed (it covers nothing)."""
    items = entries.split(",") if isinstance(entries, str) else list(entries)
    scope = []
    for raw in items:
        entry = raw.strip()
        if not entry:
            continue
        if not _PATTERN.fullmatch(entry):
            raise ValueError(
                f"{entry!r} is neither a factory id nor a pattern of one (letters, digits, "
                "'_', '.', '-', and the wildcards '*' and '?')"
            )
        scope.append(entry)
    return tuple(dict.fromkeys(scope))


def scope_of(value: object) -> tuple[str, ...]:
    """A scope from what a model is given (text or a list), checked by :func:`parse_scope`."""
    if isinstance(value, str | list | tuple):
        return parse_scope(value)
    raise ValueError("a scope is a list of factory ids or patterns")


def covers(scope: tuple[str, ...], factory_id: str) -> bool:
    """``factory_id`` is one of ``scope``'s ids or matches one of its patterns."""
    return any(
        entry == factory_id or (("*" in entry or "?" in entry) and _match(factory_id, entry))
        for entry in scope
    )


def _match(factory_id: str, pattern: str) -> bool:
    # fnmatchcase: no case folding; '[' never occurs in an entry (refused by _PATTERN)
    return fnmatch.fnmatchcase(factory_id, pattern)


class Identity(BaseModel):
    """Who is asking: a person signed in with the company's identity provider (``oidc``), a
    token (a wall screen, a script: ``token``), the CLI's user (``cli``) or a Slack user
    (``slack``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    subject: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=256)
    via: Via
    role: Role
    scope: tuple[str, ...] = ()

    _scope = field_validator("scope", mode="before")(classmethod(lambda cls, v: scope_of(v)))

    @property
    def fleet(self) -> bool:
        """Sees the whole fleet: an admin, or ``*`` in scope."""
        return self.role is Role.ADMIN or FLEET in self.scope

    @property
    def who(self) -> str:
        """How records name this identity (an incident's ``acknowledged_by``, a silence's
        ``created_by``): ``via:name``."""
        return f"{self.via}:{self.name}"


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    # why not, in words for the person refused (says nothing of other factories)
    reason: str = ""
    # 403 (the role may not do this) or 404 (the factory is out of scope: as if it did not exist)
    status: int = 200

    def __bool__(self) -> bool:
        return self.allowed


def decide(identity: Identity, act: Act, factory_id: str | None) -> Decision:
    """May ``identity`` do ``act`` to ``factory_id`` (None: to what belongs to no factory, as the
    cloud checks and fleet totals)? The one decision every route, stream and page asks.

    A factory out of scope is refused as not found (404): a scoped person learns nothing of the
    factories it may not see, not even that they exist. A role below the act's is refused with
    403 naming the role needed."""
    if factory_id is None:
        if not identity.fleet:
            return Decision(False, "only the whole fleet's scope reaches this", 403)
    elif not (identity.fleet or covers(identity.scope, factory_id)):
        return Decision(False, f"no factory {factory_id!r}", 404)
    least = LEAST_ROLE[act]
    if _RANK[identity.role] < _RANK[least]:
        return Decision(False, f"{act.value} needs the {least.value} role or higher", 403)
    return Decision(True)


def decide_role(identity: Identity, act: Act) -> Decision:
    """May ``identity``'s role do ``act`` at all (on some factory)? What a route asks before it
    knows the factory (a list it filters with :func:`visible`, an incident it has to read
    first); :func:`decide` is asked again once it does."""
    least = LEAST_ROLE[act]
    if _RANK[identity.role] < _RANK[least]:
        return Decision(False, f"{act.value} needs the {least.value} role or higher", 403)
    return Decision(True)


def visible(identity: Identity, factory_ids: list[str]) -> list[str]:
    """The ids of ``factory_ids`` ``identity`` may read, in order."""
    return [f for f in factory_ids if decide(identity, Act.READ, f)]


def factory_of(scope: str) -> str | None:
    """What :func:`decide` is asked about for an incident, silence or report of ``scope``: the
    factory, or None for ``cloud-infra`` (the platform's own)."""
    return None if scope == CLOUD_INFRA_TARGET else scope


class TokenRecord(BaseModel):
    """A dashboard token as it is kept (``TOKEN`` / ``{name}``): its SHA-256 digest, never the
    token; who may use it for what, until when; revoked ones are kept, as a record."""

    model_config = ConfigDict(extra="ignore")

    name: str
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    role: Role
    scope: tuple[str, ...]
    created_at: AwareDatetime
    created_by: str
    expires_at: AwareDatetime | None = None
    revoked_at: AwareDatetime | None = None
    revoked_by: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return keys.token_name(value)

    _scope = field_validator("scope", mode="before")(classmethod(lambda cls, v: scope_of(v)))

    def usable(self, now: datetime) -> bool:
        """Not revoked and not expired at ``now``."""
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def identity(self) -> Identity:
        return Identity(
            subject=f"token:{self.name}",
            name=self.name,
            via="token",
            role=self.role,
            scope=self.scope,
        )
