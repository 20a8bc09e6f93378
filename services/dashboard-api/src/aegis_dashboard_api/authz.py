"""Who is asking, and may they: every route of the dashboard names what it does with a
:class:`Permission` (a FastAPI dependency), which asks :func:`aegis_contracts.people.decide` and
refuses before the route runs; a route that reads a list filters it with
:func:`aegis_contracts.people.visible`, and one that must read a resource (an incident, a
silence) to know its factory asks :func:`check` once it has.

A request is identified by its bearer token (header, cookie, ``?token=``) or, when sign-in
with the company's identity provider is on, by its session. None: 401."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal

from fastapi import Request

from aegis_contracts.audit import Action
from aegis_contracts.people import Act, Decision, Identity, decide, decide_role, factory_of
from aegis_dashboard_api import audit
from aegis_dashboard_api.access import TokenSet, request_token
from aegis_dashboard_api.errors import ApiError

# what a route's act is on: the factory of a path parameter; what belongs to no factory (the
# cloud, fleet totals); a list the route filters; a resource the route reads first
On = Literal["path", "platform", "listed", "resource"]
SessionLookup = Callable[[Request], Awaitable[Identity | None]]


async def identify(request: Request) -> Identity | None:
    """The request's identity: its token's, else its session's (sign-in), else None."""
    cached = getattr(request.state, "identity", None)
    if isinstance(cached, Identity):
        return cached
    tokens: TokenSet = request.app.state.tokens
    who = tokens.identify(request_token(request), request.app.state.clock())
    if who is None:
        sessions: SessionLookup | None = getattr(request.app.state, "sessions", None)
        if sessions is not None:
            who = await sessions(request)
    if who is not None:
        request.state.identity = who
    return who


def refuse(decision: Decision) -> ApiError:
    error = "not_found" if decision.status == 404 else "forbidden"
    return ApiError(decision.status, error, decision.reason)


class Permission:
    """A route's dependency: identifies the request (401 without an identity) and refuses what
    :func:`decide` refuses (404 for a factory out of scope, 403 for a role too low). Its
    ``act`` and ``on`` are what the schema test reads: a route without one fails it."""

    def __init__(
        self, act: Act, on: On, param: str = "factory_id", *, audit: Action | None = None
    ) -> None:
        self.act, self.on, self.param, self.audit = act, on, param, audit

    def __repr__(self) -> str:
        return f"Permission({self.act.value}, {self.on})"

    async def __call__(self, request: Request) -> Identity:
        who = await identify(request)
        if who is None:
            raise ApiError(
                401, "unauthorized", "a valid bearer token or a signed-in session is required"
            )
        if self.on == "path":
            decision = decide(who, self.act, factory_of(request.path_params[self.param]))
        elif self.on == "platform":
            decision = decide(who, self.act, None)
        else:  # the route decides per factory once it knows them
            decision = decide_role(who, self.act)
        if not decision:
            if self.audit is not None:  # a change refused is on the record too
                target = request.path_params.get(self.param) or None
                await audit.record(
                    request, self.audit, "refused", who=who, target=target, detail=decision.reason
                )
            raise refuse(decision)
        return who


def session_of(request: Request) -> str | None:
    """The sign-in session a request came with (its id), when it was identified by one."""
    session = getattr(request.state, "session_id", None)
    return session if isinstance(session, str) else None


def identity_of(request: Request) -> Identity:
    """The identity a route's :class:`Permission` found (routes run only after it)."""
    who = getattr(request.state, "identity", None)
    if not isinstance(who, Identity):
        raise TypeError("the route has no Permission dependency")
    return who


def check(request: Request, act: Act, scope: str) -> Identity:
    """For a route that read a resource first: may the request's identity do ``act`` on
    ``scope`` (a factory id, or ``cloud-infra``)? Refused as :func:`decide` says."""
    who = identity_of(request)
    decision = decide(who, act, factory_of(scope))
    if not decision:
        raise refuse(decision)
    return who


async def public(request: Request) -> None:
    """The dependency of a route anyone may call (the sign-in form, health, Slack's signed
    requests, which check their own signature): named, so the schema test knows it is meant."""
    request.state.public = True
