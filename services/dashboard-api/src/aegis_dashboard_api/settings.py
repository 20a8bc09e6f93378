"""Dashboard API settings: the shared AEGIS ones plus where it listens, who may read, CORS."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import Field, field_validator

from aegis_dashboard_api.access import is_digest
from aegis_runtime.settings import AegisSettings


def _items(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


class DashboardSettings(AegisSettings):
    """``AEGIS_*`` variables."""

    service: str = "dashboard-api"
    dashboard_host: str = "127.0.0.1"
    dashboard_port: int = Field(default=8080, ge=0, le=65535)
    # comma-separated SHA-256 hex digests of the read-only bearer tokens (hashed at rest);
    # none: every /api request is refused
    dashboard_tokens: str = ""
    # more digests, one per line, read again every tokens_reload_s when the file changed (a
    # mounted Secret): removing one revokes its token, open live streams included
    dashboard_tokens_file: Path | None = None
    dashboard_tokens_reload_s: float = Field(default=5.0, gt=0, le=3600)
    # comma-separated origins allowed by CORS; none (the default): no CORS headers at all
    dashboard_cors_origins: str = ""
    # how long a presigned image URL stays valid
    dashboard_presign_ttl_s: int = Field(default=300, ge=1, le=3600)
    # the fleet view is read at most this often, once for every open screen
    dashboard_fleet_cache_s: float = Field(default=1.0, ge=0, le=60)
    # the fleet is kept warm (re-read every cache period) only while a screen asked for it this
    # recently; idle, nothing is read (open screens still get the change feed)
    dashboard_fleet_idle_s: float = Field(default=60.0, gt=0, le=3600)
    # live updates (/api/live): the NATS subscription, each browser's queue of undelivered
    # events (a browser that falls this far behind is dropped and reconnects), the heartbeat
    dashboard_live: bool = True
    dashboard_live_queue: int = Field(default=256, ge=1, le=100_000)
    dashboard_live_ping_s: float = Field(default=15.0, gt=0, le=300)
    # open live streams per process; one more is answered 503 (a browser retries later)
    dashboard_live_max_listeners: int = Field(default=1000, ge=1, le=100_000)
    # failed sign-ins a client may make per window; then 429 until the window moves on
    dashboard_signin_attempts: int = Field(default=10, ge=1, le=10_000)
    dashboard_signin_window_s: int = Field(default=60, ge=1, le=86_400)
    # the proxies (addresses or networks, comma-separated) whose X-Forwarded-For/-Proto are
    # believed: behind a TLS-terminating load balancer list it, so the sign-in cookie is Secure
    # and each user is limited as themselves. Empty: no forwarded header is believed.
    dashboard_trusted_proxies: str = ""

    @field_validator("dashboard_tokens")
    @classmethod
    def _digests(cls, value: str) -> str:
        for digest in _items(value):
            if not is_digest(digest.lower()):
                raise ValueError(
                    "AEGIS_DASHBOARD_TOKENS holds SHA-256 hex digests (64 hex characters), "
                    "comma-separated, not the tokens themselves"
                )
        return value

    @property
    def token_digests(self) -> tuple[str, ...]:
        return tuple(d.lower() for d in _items(self.dashboard_tokens))

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
