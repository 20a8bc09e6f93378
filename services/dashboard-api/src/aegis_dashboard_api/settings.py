"""Dashboard API settings: the shared AEGIS ones plus where it listens, who may read, CORS."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from aegis_runtime.settings import AegisSettings

_DIGEST = re.compile(r"[0-9a-f]{64}")


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

    @field_validator("dashboard_tokens")
    @classmethod
    def _digests(cls, value: str) -> str:
        for digest in _items(value):
            if not _DIGEST.fullmatch(digest.lower()):
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
