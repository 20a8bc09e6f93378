"""Settings every AEGIS service shares, read from the environment with the ``AEGIS_`` prefix.

A service subclasses :class:`AegisSettings` and adds its own fields; ``create_app(settings=None)``
builds one and passes it down, so nothing reads the environment twice and tests pass keywords.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from aegis_contracts.ttl import TtlSettings
from aegis_storage.clients import AwsConfig

# raw events one factory and source may have waiting (AEGIS_NATS_RAW_MAX_PER_FACTORY)
RAW_MAX_PER_FACTORY = 100_000


class AegisSettings(BaseSettings):
    """Every process's ``AEGIS_*`` settings. Unknown ``AEGIS_*`` variables are ignored, not
    fatal."""

    model_config = SettingsConfigDict(
        env_prefix="AEGIS_",
        env_file=None,
        extra="ignore",
        secrets_dir=None,
        validate_default=True,
    )

    service: str = "aegis"
    # where a process keeps files of its own (a migration's journal); unset: $XDG_STATE_HOME/aegis
    # or ~/.local/state/aegis. Images set /var/lib/aegis (a volume): their /app is read-only
    state_dir: Path | None = None
    aws_endpoint_url: str | None = None
    region: str = "ap-south-1"
    bucket: str = "aegis-bucket-data"
    table: str = "AEGIS-DynamoDB-FactoryStatus"
    mqtt_url: str = "mqtt://127.0.0.1:1883"
    # the broker identity of this process (`aegis devices add`); they win over user:pass in the URL
    mqtt_username: str | None = None
    mqtt_password: SecretStr | None = None
    # TLS: on with an mqtts:// URL or a CA file; the CA that signed the broker's certificate
    # (unset: the system's trust store)
    mqtt_ca_file: Path | None = None
    nats_url: str = "nats://127.0.0.1:4222"
    # this process's NATS identity (aegis_cli.natsauth: what each service may publish and
    # consume); unset: connect without one (a local server that asks for none)
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    # create and update the streams at start (a server without identities, `make run`); with
    # identities only the admin (`aegis streams`) manages streams and services check them
    nats_manage_streams: bool = True
    # TLS to NATS: on with tls:// URLs or a CA file; the CA that signed the servers' certificates
    # (unset: the system's trust store), and a client certificate for servers that ask for one
    nats_tls_ca_file: Path | None = None
    # the same CA as PEM text, where no file can be mounted (ECS on Fargate: an SSM parameter)
    nats_tls_ca_pem: str | None = None
    nats_tls_cert_file: Path | None = None
    nats_tls_key_file: Path | None = None
    # JetStream streams (created or brought up to these at every start; a start never lowers
    # replicas, max age or max bytes an operator raised): replicas (3 on a 3-node cluster),
    # bytes per stream by name (e.g. {"AEGIS_RAW": 10737418240}; absent: unbounded), and the
    # raw events one factory and source may have waiting (beyond: ingest dead-letters the
    # message as queue_full; the raw object is kept and `aegis replay` requeues it)
    nats_stream_replicas: int = Field(default=1, ge=1, le=5)
    nats_stream_max_bytes: dict[str, int] = Field(default_factory=dict)
    nats_raw_max_per_factory: int = Field(default=RAW_MAX_PER_FACTORY, ge=1)
    slack_webhook_url: SecretStr | None = None
    dashboard_url: str = "http://127.0.0.1:8080"

    # TTLs keep the seed's names (infra/data-pipeline/variables.tf) and defaults.
    history_ttl_hours: float = Field(default=2, gt=0)
    graph_bucket_ttl_hours: float = Field(default=48, gt=0)
    cloud_fast_history_ttl_hours: float = Field(default=6, gt=0)
    cloud_slow_history_ttl_hours: float = Field(default=24, gt=0)
    alert_state_ttl_seconds: int = Field(default=604_800, gt=0)
    # the aggregator folds a 5-minute window this long after it ends (late commits land first);
    # the processor marks a factory-hour for folding again when it writes an object into an
    # hour that ended longer ago than this (less a margin for the hosts' clocks): one setting,
    # so the two cannot disagree
    aggregate_delay_s: float = Field(default=15.0, ge=0, le=240)

    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: str = "INFO"
    health_host: str = "127.0.0.1"
    health_port: int = Field(default=0, ge=0, le=65535)
    max_concurrency: int = Field(default=64, ge=1, le=4096)
    # every replica announces itself on aegis.heartbeat.{service}.{instance} this often
    heartbeat_interval_s: float = Field(default=10.0, gt=0)
    # on stop, in-flight messages get this long to finish before their handlers are cancelled
    graceful_timeout_s: float = Field(default=20.0, gt=0)

    def state_path(self, name: str) -> Path:
        """``name`` in the state directory, which is made when missing (never the working
        directory: it may be read-only, as an image's /app is)."""
        folder = self.state_dir
        if folder is None:
            xdg = os.environ.get("XDG_STATE_HOME")
            folder = (Path(xdg) if xdg else Path.home() / ".local" / "state") / "aegis"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / name

    def nats_servers(self) -> list[str]:
        """The servers of ``nats_url`` (comma-separated). The identity is not in them: it goes
        with every connection as its own option, so that servers a cluster advertises (which
        nats-py adds to its list, without user info) get it too."""
        return [u.strip() for u in self.nats_url.split(",") if u.strip()]

    @property
    def nats_tls(self) -> bool:
        servers = self.nats_url.split(",")
        return (
            self.nats_tls_ca_file is not None
            or self.nats_tls_ca_pem is not None
            or any(urlsplit(u.strip()).scheme == "tls" for u in servers)
        )

    def nats_tls_context(self) -> ssl.SSLContext | None:
        """The client TLS context for NATS (hostname checked), or None for plain connections."""
        if not self.nats_tls:
            return None
        cafile = str(self.nats_tls_ca_file) if self.nats_tls_ca_file is not None else None
        context = ssl.create_default_context(cafile=cafile, cadata=self.nats_tls_ca_pem)
        if self.nats_tls_cert_file is not None:
            key = str(self.nats_tls_key_file) if self.nats_tls_key_file is not None else None
            context.load_cert_chain(str(self.nats_tls_cert_file), key)
        return context

    @property
    def ttl(self) -> TtlSettings:
        return TtlSettings(
            history_ttl_hours=self.history_ttl_hours,
            graph_bucket_ttl_hours=self.graph_bucket_ttl_hours,
            cloud_fast_history_ttl_hours=self.cloud_fast_history_ttl_hours,
            cloud_slow_history_ttl_hours=self.cloud_slow_history_ttl_hours,
            alert_state_ttl_seconds=self.alert_state_ttl_seconds,
        )

    @property
    def mqtt_tls(self) -> bool:
        return urlsplit(self.mqtt_url).scheme in {"mqtts", "ssl"} or self.mqtt_ca_file is not None

    def mqtt_endpoint(self) -> tuple[str, int, str | None, str | None]:
        """(host, port, username, password): ``AEGIS_MQTT_USERNAME``/``AEGIS_MQTT_PASSWORD``, else
        the user:password of ``mqtt_url``."""
        url = urlsplit(self.mqtt_url)
        username = self.mqtt_username or (unquote(url.username) if url.username else None)
        if self.mqtt_password is not None:
            password: str | None = self.mqtt_password.get_secret_value()
        else:
            password = unquote(url.password) if url.password else None
        port = url.port or (8883 if self.mqtt_tls else 1883)
        return url.hostname or "127.0.0.1", port, username, password

    def mqtt_tls_context(self) -> ssl.SSLContext | None:
        """The client TLS context for the broker (hostname checked), or None for plain MQTT."""
        if not self.mqtt_tls:
            return None
        cafile = str(self.mqtt_ca_file) if self.mqtt_ca_file is not None else None
        return ssl.create_default_context(cafile=cafile)

    def aws(self) -> AwsConfig:
        """Client settings with a connection pool sized for this service's concurrency."""
        return AwsConfig(
            region=self.region,
            endpoint_url=self.aws_endpoint_url,
            max_pool_connections=max(10, self.max_concurrency),
        )
