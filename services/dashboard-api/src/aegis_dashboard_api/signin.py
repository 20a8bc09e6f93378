"""Sign-in with the company's OpenID Connect provider (``AEGIS_OIDC_ISSUER``): the authorization
code flow with PKCE (S256), state and nonce, all checked by Authlib, then a server-side session.

- ``GET /auth/login?next=/path`` sends the browser to the provider. While the person is there,
  Authlib's state, nonce and PKCE verifier wait in a short-lived signed cookie of their own
  (Starlette's session, ``aegis_signin_flow``, path ``/auth``, 10 minutes).
- ``GET /auth/callback``: the code is exchanged, the ID token checked (signature, issuer,
  audience, nonce); the groups claim (from the ID token, else from userinfo) makes the
  :class:`~aegis_contracts.people.Identity` through the roles file (:mod:`.roles`); a person in
  no mapped group is refused with a page that says so. A session is recorded in DynamoDB
  (:mod:`aegis_storage.sessions`) and the browser gets a cookie with only its random id, signed,
  HttpOnly, SameSite=Lax (the provider's redirect back is a cross-site top-level GET), Secure
  over https.
- ``POST /auth/logout`` ends the session in the table (a copy of the cookie is refused from then
  on, by every replica), clears the cookie and, when the provider has an ``end_session_endpoint``,
  sends the browser there to end its provider session too (``id_token_hint``,
  ``post_logout_redirect_uri`` = ``/auth/signed-out``).
- ``GET /auth/me``: the signed-in identity as JSON, 401 without one.

The access layer asks :func:`session_identity` for a request's identity. Without an issuer the
routes answer 404 and :func:`session_identity` is always None.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Annotated, Any
from urllib.parse import urlencode

import httpx2
import structlog
from authlib.integrations.base_client import OAuthError
from authlib.integrations.starlette_client import OAuth, StarletteOAuth2App
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from itsdangerous import BadSignature, Signer
from joserfc.errors import JoseError
from starlette.exceptions import HTTPException
from starlette.middleware.sessions import SessionMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from aegis_contracts.people import Identity
from aegis_dashboard_api import audit
from aegis_dashboard_api.authz import public
from aegis_dashboard_api.errors import ApiError
from aegis_dashboard_api.i18n import labels
from aegis_dashboard_api.pages import lang_of, render, safe_next
from aegis_dashboard_api.roles import RoleMapping, identity_from_claims, load_roles
from aegis_dashboard_api.routes import Reader
from aegis_dashboard_api.settings import DashboardSettings
from aegis_storage.sessions import SessionStore

log = structlog.get_logger(__name__)

SESSION_COOKIE = "aegis_session"
FLOW_COOKIE = "aegis_signin_flow"
FLOW_MAX_AGE_S = 600  # the time a person may take at the provider's sign-in page
NEXT_KEY = "aegis_next"  # where to go once signed in, kept in the flow cookie
PROVIDER_TIMEOUT_S = 10.0


class SignIn:
    """What the routes share: the provider's client (Authlib), the roles, the cookie signer."""

    def __init__(self, settings: DashboardSettings) -> None:
        assert settings.oidc_issuer is not None
        assert settings.oidc_client_secret is not None
        assert settings.oidc_roles_file is not None
        assert settings.dashboard_session_secret is not None
        self.settings = settings
        self.mapping: RoleMapping = load_roles(settings.oidc_roles_file)  # wrong: fails start-up
        self.max_age = timedelta(seconds=settings.dashboard_session_max_age_s)
        self.signer = Signer(
            settings.dashboard_session_secret.get_secret_value(), salt="aegis-session-id"
        )
        oauth = OAuth()
        self.client: StarletteOAuth2App = oauth.register(
            "oidc",
            client_id=settings.oidc_client_id,
            client_secret=settings.oidc_client_secret.get_secret_value(),
            server_metadata_url=(
                f"{settings.oidc_issuer.rstrip('/')}/.well-known/openid-configuration"
            ),
            client_kwargs={
                "scope": settings.oidc_scopes,
                "code_challenge_method": "S256",
                "timeout": PROVIDER_TIMEOUT_S,
            },
        )

    def session_id(self, request: Request) -> str | None:
        """The session id of the request's cookie if its signature holds, else None."""
        cookie = request.cookies.get(SESSION_COOKIE)
        if not cookie:
            return None
        try:
            return self.signer.unsign(cookie).decode()
        except (BadSignature, UnicodeDecodeError):
            return None

    def set_cookie(self, response: Response, request: Request, session_id: str) -> None:
        response.set_cookie(
            SESSION_COOKIE,
            self.signer.sign(session_id).decode(),
            max_age=self.settings.dashboard_session_max_age_s,
            httponly=True,
            samesite="lax",
            secure=request.url.scheme == "https",
            path="/",
        )


def _signin(request: Request) -> SignIn:
    """The route's dependency: sign-in as configured, or 404 when there is no issuer."""
    signin: SignIn | None = getattr(request.app.state, "signin", None)
    if signin is None:
        raise HTTPException(404)
    return signin


Configured = Annotated[SignIn, Depends(_signin)]


def _sessions(request: Request) -> tuple[SessionStore, Reader]:
    reader: Reader = request.app.state.reader
    return SessionStore(reader.readmodel), reader


async def session_identity(request: Request) -> Identity | None:
    """The identity of the request's sign-in session; None when there is no cookie, its
    signature is wrong, or the session is unknown, expired or signed out (on any replica)."""
    signin: SignIn | None = getattr(request.app.state, "signin", None)
    if signin is None:
        return None
    session_id = signin.session_id(request)
    if session_id is None:
        return None
    store, reader = _sessions(request)
    session = await store.get(session_id, now=reader.clock())
    if session is None:
        return None
    request.state.session_id = session_id  # its live streams end when it does
    return session.identity


def _page(request: Request, heading: str, message: str, *, status: int) -> Response:
    return render(
        request,
        "signin.html",
        {"heading": heading, "message": message, "refused": status >= 400},
        status_code=status,
    )


async def _failed(request: Request, reason: str, *, status: int = 400) -> Response:
    log.warning("signin_failed", reason=reason)
    unreachable = status == 502
    await audit.record(
        request,
        "sign_in",
        "failed" if unreachable else "refused",
        detail=reason,
        failure="provider_unreachable" if unreachable else "provider_refused",
    )
    t = labels(lang_of(request))
    key = "oidc_unreachable" if status == 502 else "oidc_failed"
    return _page(request, t["oidc_refused"], t[key], status=status)


# sign-in itself is open to anyone (the provider decides who gets a session)
router = APIRouter(prefix="/auth", include_in_schema=False, dependencies=[Depends(public)])


@router.get("/login")
async def login(request: Request, signin: Configured) -> Response:
    """Send the browser to the provider (``next``: where to come back to, a path of this site)."""
    request.session[NEXT_KEY] = safe_next(request.query_params.get("next"))
    try:
        response: Response = await signin.client.authorize_redirect(
            request, request.url_for("oidc_callback")
        )
    except httpx2.HTTPError as err:
        return await _failed(request, f"the provider's discovery document: {err}", status=502)
    return response


@router.get("/callback", name="oidc_callback")
async def callback(request: Request, signin: Configured) -> Response:
    """The provider's redirect back: code → tokens (Authlib checks state, PKCE, the ID token and
    its nonce), groups → identity, then a session and its cookie."""
    try:
        # untyped in types-authlib 1.8
        token = await signin.client.authorize_access_token(request)  # type: ignore[no-untyped-call]
        claims = await _claims(signin, token)
    except (OAuthError, JoseError) as err:  # wrong state, nonce, signature; the provider's error
        return await _failed(request, f"{type(err).__name__}: {err}")
    except httpx2.HTTPError as err:
        return await _failed(request, f"the provider: {err}", status=502)
    identity = identity_from_claims(claims, signin.mapping)
    if identity is None:
        log.warning("signin_refused", subject=claims.get("sub"), reason="no_mapped_group")
        t = labels(lang_of(request))
        name = str(claims.get("email") or claims.get("name") or claims.get("sub") or "?")
        await audit.record(
            request, "sign_in", "refused", target=str(claims.get("sub") or ""),
            detail=f"{name}: in no group the roles file maps", failure="unknown_user",
        )  # fmt: skip
        return _page(
            request, t["oidc_refused"], t["oidc_no_group"].replace("{name}", name), status=403
        )
    store, reader = _sessions(request)
    now = reader.clock()
    previous = signin.session_id(request)
    if previous is not None:  # a browser signing in again leaves no second session behind
        await store.end(previous, now=now)
    session_id = secrets.token_urlsafe(32)
    await store.start(
        session_id, identity, now=now, max_age=signin.max_age, id_token=token.get("id_token")
    )
    log.info("signed_in", subject=identity.subject, role=identity.role, scope=identity.scope)
    await audit.record(request, "sign_in", "ok", who=identity)
    response = RedirectResponse(safe_next(request.session.pop(NEXT_KEY, "/")), status_code=303)
    signin.set_cookie(response, request, session_id)
    return response


async def _claims(signin: SignIn, token: dict[str, Any]) -> dict[str, Any]:
    """The ID token's claims, with userinfo's when the ID token lacks the groups claim (many
    providers send only ``sub`` in it); userinfo about another subject is refused."""
    claims = dict(token.get("userinfo") or {})
    if not claims:
        raise OAuthError(error="no_id_token", description="the provider sent no ID token")
    metadata = await signin.client.load_server_metadata()
    if signin.mapping.groups_claim not in claims and metadata.get("userinfo_endpoint"):
        userinfo = dict(await signin.client.userinfo(token=token))
        if userinfo.get("sub") != claims.get("sub"):
            raise OAuthError(error="userinfo_subject", description="userinfo is about another sub")
        claims = userinfo | claims
    return claims


@router.post("/logout")
async def logout(request: Request, signin: Configured) -> Response:
    """End the session here (at once, on every replica), clear the cookie, then end the
    provider's session too when it has an ``end_session_endpoint``."""
    session_id = signin.session_id(request)
    ended = None
    if session_id is not None:
        store, reader = _sessions(request)
        ended = await store.end(session_id, now=reader.clock())
        if ended is not None:
            log.info("signed_out", subject=ended.identity.subject)
            await audit.record(request, "sign_out", "ok", who=ended.identity)
        # this replica's streams of it end now; another replica's at its next look
        request.app.state.hub.revoke(lambda listener: listener.session != session_id)
    target = str(request.url_for("oidc_signed_out"))
    if ended is not None and ended.id_token:
        try:
            metadata = await signin.client.load_server_metadata()
        except httpx2.HTTPError as err:  # signed out here all the same
            log.warning("provider_signout_skipped", error=str(err))
            metadata = {}
        if end_session := metadata.get("end_session_endpoint"):
            query = urlencode(
                {
                    "id_token_hint": ended.id_token,
                    "post_logout_redirect_uri": target,
                    "client_id": signin.settings.oidc_client_id,
                }
            )
            target = f"{end_session}{'&' if '?' in end_session else '?'}{query}"
    response = RedirectResponse(target, status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="lax")
    return response


@router.get("/signed-out", name="oidc_signed_out")
async def signed_out(request: Request, _: Configured) -> Response:
    t = labels(lang_of(request))
    return _page(request, t["sign_out"], t["signed_out"], status=200)


@router.get("/me")
async def me(request: Request, _: Configured) -> JSONResponse:
    """Who the session says the browser is; 401 without a valid session."""
    identity = await session_identity(request)
    if identity is None:
        raise ApiError(401, "unauthorized", "no valid sign-in session")
    return JSONResponse(identity.model_dump(mode="json"), headers={"Cache-Control": "no-store"})


class _FlowCookie:
    """Starlette's session middleware for the sign-in flow's cookie, Secure when the request
    came over https (Starlette fixes that flag per middleware, not per request)."""

    def __init__(self, app: ASGIApp, *, secret: str) -> None:
        options: dict[str, Any] = {
            "secret_key": secret,
            "session_cookie": FLOW_COOKIE,
            "max_age": FLOW_MAX_AGE_S,
            "path": "/auth",
            "same_site": "lax",
        }
        self.plain = SessionMiddleware(app, https_only=False, **options)
        self.secure = SessionMiddleware(app, https_only=True, **options)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        middleware = self.secure if scope.get("scheme") in ("https", "wss") else self.plain
        await middleware(scope, receive, send)


def install(app: FastAPI) -> None:
    """The ``/auth`` routes, and (with ``AEGIS_OIDC_ISSUER``) the provider's client and the
    flow cookie's middleware. Reads the roles file: a wrong one stops the start."""
    settings: DashboardSettings = app.state.settings
    app.state.signin = None
    if settings.oidc_issuer is not None:
        app.state.signin = SignIn(settings)
        app.state.sessions = session_identity  # what authz.identify asks after the token
        assert settings.dashboard_session_secret is not None
        # the same key: Starlette's signer salts it otherwise than the session id's
        app.add_middleware(_FlowCookie, secret=settings.dashboard_session_secret.get_secret_value())
    app.include_router(router)
