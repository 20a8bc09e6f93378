"""The audit record: every action a person takes (or is refused) on the platform, with who,
what, when and from where.

Each event is one object, ``audit/yyyy=/mm=/dd=/{id}.json``, written once (if-none-match) and
never expired, like a closed incident's record. The id starts with the event's UTC time, so a
day's listing is its events in order.
"""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from aegis_contracts import keys
from aegis_contracts.people import Via

Action = Literal[
    "sign_in",
    "sign_out",
    "incident.acknowledge",
    "incident.resolve",
    "silence.create",
    "silence.end",
    "token.create",
    "token.revoke",
    "job.register",
    "job.replace",
    "job.delete",
    "job.enable",
    "job.disable",
]
Outcome = Literal["ok", "refused", "failed"]
# why a sign-in did not succeed: a wrong (unknown, expired, revoked) token; too many failed
# attempts from the address (locked out for a while); someone the identity provider knows but
# the roles file maps to no role; the provider's answer refused (state, nonce, signature) or
# the provider not reachable
SignInFailure = Literal[
    "wrong_token", "locked", "unknown_user", "provider_refused", "provider_unreachable"
]


class AuditEvent(BaseModel):
    """``actor`` is how records name the person (``oidc:Kim``, ``token:wall-3``, ``cli:lee``),
    ``subject`` their stable id at the identity provider or the token (None when nobody was
    identified: a refused sign-in); ``target`` what was acted on (an incident or silence id, a
    token's name, a job id); ``factory`` its factory (``cloud-infra``, or None when it has
    none); ``failure`` why a sign-in did not succeed; ``source`` the client address and
    ``agent`` its user agent, as the server saw them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^\d{8}T\d{9}-[0-9a-f]{8}$")
    at: AwareDatetime
    action: Action
    outcome: Outcome
    actor: str = Field(max_length=300)
    subject: str | None = Field(default=None, max_length=300)
    via: Via | None = None
    target: str | None = Field(default=None, max_length=300)
    factory: str | None = Field(default=None, max_length=128)
    detail: str = Field(default="", max_length=2000)
    failure: SignInFailure | None = None
    source: str | None = Field(default=None, max_length=100)
    agent: str | None = Field(default=None, max_length=300)

    @property
    def key(self) -> str:
        return keys.audit_key(self.at, self.id)


def new_event_id(at: datetime) -> str:
    return f"{at:%Y%m%dT%H%M%S}{at.microsecond // 1000:03d}-{secrets.token_hex(4)}"
