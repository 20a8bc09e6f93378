"""Dashboard API settings: the shared AEGIS ones plus where it listens, who may read, CORS."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator

from aegis_dashboard_api.access import Grant, configured_grant
from aegis_orchestration.tenants import FILE_DESCRIPTION
from aegis_runtime.settings import AegisSettings


def _items(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


class DashboardSettings(AegisSettings):
    """``AEGIS_*`` variables."""

    service: str = "dashboard-api"
    dashboard_host: str = Field(
        default="127.0.0.1",
        description="The address the dashboard and its API listen on (`0.0.0.0` in a container).",
    )
    dashboard_port: int = Field(
        default=8080, ge=0, le=65535, description="The port the dashboard and its API listen on."
    )
    dashboard_tokens: str = Field(
        default="",
        description="SHA-256 hex digests of bearer tokens, comma-separated (`printf %s TOKEN | "
        "sha256sum`), from a secret store; each a viewer of the whole fleet (a wall screen) "
        "unless `ROLE:` comes before it (`responder:`, `admin:`). Tokens for people or scripts "
        "with a name and a scope: `aegis tokens create`. None of either (and no tokens file, no "
        "sign-in): every page and `/api` request is refused.",
    )
    dashboard_tokens_file: Path | None = Field(
        default=None,
        description="More token digests, one per line (`#` comments), each optionally followed "
        "by `role=`, `name=` and `factories=a,plant-*`; read again when the file changes (a "
        "mounted Secret): removing one revokes its token, open live streams included.",
    )
    dashboard_tokens_reload_s: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="Seconds between two looks at `AEGIS_DASHBOARD_TOKENS_FILE`.",
    )
    dashboard_cors_origins: str = Field(
        default="",
        description="Origins allowed to read the API from a browser, comma-separated. None: no "
        "CORS headers at all.",
    )
    dashboard_presign_ttl_s: int = Field(
        default=300, ge=1, le=3600, description="Seconds a presigned image URL stays valid."
    )
    dashboard_incidents_refresh_s: float = Field(
        default=30.0,
        ge=1,
        le=300,
        description="An open incidents list (or a factory's banners) is read again this often "
        "(seconds) while visible. Changes reach it at once on the live stream; this read "
        "catches what a screen missed.",
    )
    dashboard_executions_refresh_s: float = Field(
        default=3.0,
        ge=1,
        le=300,
        description="A job's page reads its executions again this often (seconds) while "
        "visible, so the steps of a running execution change state on it without a reload "
        "(an unchanged list is answered 304, by its ETag).",
    )
    dashboard_fleet_cache_s: float = Field(
        default=1.0,
        ge=0,
        le=60,
        description="The fleet is read at most this often (seconds), once for every open screen.",
    )
    dashboard_fleet_idle_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="Seconds the fleet is kept warm (read again every cache period) after a "
        "screen last asked for it; idle, nothing is read (open screens still get the change "
        "feed).",
    )
    dashboard_live: bool = Field(
        default=True,
        description="Live updates (`/api/live`): the dashboard subscribes to the change events "
        "on NATS and streams them to the browsers.",
    )
    dashboard_select_events: bool = Field(
        default=True,
        description="Announce each read of one factory, incident or job through the API as a "
        "system event `select` (`aegis.events.select`, one per person, entity and minute): "
        "the orchestrator's Automation jobs of sub type `Select`. Needs `AEGIS_DASHBOARD_LIVE`.",
    )
    dashboard_live_queue: int = Field(
        default=256,
        ge=1,
        le=100_000,
        description="Events a browser may be behind; one that falls further behind is dropped "
        "and reconnects.",
    )
    dashboard_live_ping_s: float = Field(
        default=15.0,
        gt=0,
        le=300,
        description="Seconds between heartbeat comments on a live stream (keeps proxies from "
        "closing it).",
    )
    dashboard_live_max_listeners: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Open live streams per process; one more is answered 503 (the page retries "
        "later).",
    )
    dashboard_signin_attempts: int = Field(
        default=10,
        ge=1,
        le=10_000,
        description="Failed sign-ins one client may make per window; then 429 until the window "
        "moves on.",
    )
    dashboard_signin_window_s: int = Field(
        default=60, ge=1, le=86_400, description="The sign-in window, seconds."
    )
    dashboard_trusted_proxies: str = Field(
        default="",
        description="Proxies (addresses or networks, comma-separated) whose X-Forwarded-For and "
        "X-Forwarded-Proto are believed: behind a TLS-terminating load balancer list it, so the "
        "sign-in cookie is Secure and each user is limited as themselves. None: no forwarded "
        "header is believed.",
    )

    slack_signing_secret: SecretStr | None = Field(
        default=None,
        description="The Slack app's signing secret: `POST /slack/interactions` (the Acknowledge "
        "button of an alert) takes only requests Slack signed with it, within five minutes of "
        "their timestamp, each once. Unset: that route answers 404.",
    )
    slack_response_url_prefix: str = Field(
        default="https://hooks.slack.com/",
        description="Where a Slack interaction's `response_url` must point for the dashboard to "
        "update the message (shows who acknowledged); any other URL is not called.",
    )

    # -- sign-in with the company's OpenID Connect provider (aegis_dashboard_api.signin) ------
    oidc_issuer: str | None = Field(
        default=None,
        description="The OpenID Connect provider's issuer URL (its discovery document is "
        "`{issuer}/.well-known/openid-configuration`): people sign in there, authorization code "
        "flow with PKCE, and come back to `{dashboard}/auth/callback`. Unset: no OIDC sign-in, "
        "the `/auth/...` routes answer 404.",
    )
    oidc_client_id: str = Field(
        default="", description="The dashboard's client id at the OpenID Connect provider."
    )
    oidc_client_secret: SecretStr | None = Field(
        default=None,
        description="The dashboard's client secret at the OpenID Connect provider (a "
        "confidential client), from a secret store.",
    )
    oidc_scopes: str = Field(
        default="openid profile email groups",
        description="The scopes asked for at sign-in, space-separated: `openid`, and those that "
        "bring the name and the groups claim (providers without a `groups` scope send groups "
        "with `profile`, or by a mapper: leave it out for them).",
    )
    # the orchestrator's tenants file: a job of a tenant it does not declare is refused here too
    orchestrator_tenants_file: Path | None = Field(default=None, description=FILE_DESCRIPTION)
    oidc_roles_file: Path | None = Field(
        default=None,
        description="The TOML file that maps the provider's groups to roles and factory scopes "
        "(`groups_claim`, then `[[rule]]` tables of `group`, `role`, `factories`; see "
        "docs/dashboard.md). A person in several groups gets the highest role and every scope; "
        "in none, sign-in is refused. Required with `AEGIS_OIDC_ISSUER`.",
    )
    dashboard_session_secret: SecretStr | None = Field(
        default=None,
        description="The key that signs the sign-in cookies (the session id, and the sign-in "
        "flow's state, nonce and PKCE verifier), at least 32 characters, from a secret store; "
        "the same on every replica. Required with `AEGIS_OIDC_ISSUER`.",
    )
    dashboard_session_max_age_s: int = Field(
        default=8 * 3600,
        ge=60,
        le=30 * 86_400,
        description="Seconds a sign-in lasts (the session ends then, whatever the provider "
        "says); signing out ends it at once on every replica.",
    )

    @model_validator(mode="after")
    def _oidc_complete(self) -> DashboardSettings:
        if self.oidc_issuer is None:
            return self
        missing = [
            name
            for name, value in (
                ("AEGIS_OIDC_CLIENT_ID", self.oidc_client_id),
                ("AEGIS_OIDC_CLIENT_SECRET", self.oidc_client_secret),
                ("AEGIS_OIDC_ROLES_FILE", self.oidc_roles_file),
                ("AEGIS_DASHBOARD_SESSION_SECRET", self.dashboard_session_secret),
            )
            if not value
        ]
        if missing:
            raise ValueError(f"AEGIS_OIDC_ISSUER is set: {', '.join(missing)} must be set too")
        secret = self.dashboard_session_secret
        if secret is not None and len(secret.get_secret_value()) < 32:
            raise ValueError("AEGIS_DASHBOARD_SESSION_SECRET must be at least 32 characters")
        return self

    @field_validator("dashboard_tokens")
    @classmethod
    def _digests(cls, value: str) -> str:
        for entry in _items(value):
            try:
                configured_grant(entry)
            except ValueError as err:
                raise ValueError(
                    f"AEGIS_DASHBOARD_TOKENS holds SHA-256 hex digests (64 hex characters), each "
                    f"optionally after ROLE:, comma-separated, not the tokens themselves: {err}"
                ) from None
        return value

    @property
    def token_grants(self) -> tuple[Grant, ...]:
        return tuple(configured_grant(e) for e in _items(self.dashboard_tokens))

    @property
    def cors_origins(self) -> list[str]:
        return _items(self.dashboard_cors_origins)

    @property
    def trusted_proxies(self) -> list[str]:
        return _items(self.dashboard_trusted_proxies)

    @field_validator("dashboard_trusted_proxies")
    @classmethod
    def _networks(cls, value: str) -> str:
        for entry in _items(value):
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(
                    f"AEGIS_DASHBOARD_TRUSTED_PROXIES: {entry!r} is not an address or network"
                ) from None
        return value
