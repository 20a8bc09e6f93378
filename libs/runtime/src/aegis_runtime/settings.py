"""Settings every AEGIS service shares, read from the environment with the ``AEGIS_`` prefix.

A service subclasses :class:`AegisSettings` and adds its own fields; ``create_app(settings=None)``
builds one and passes it down, so nothing reads the environment twice and tests pass keywords.

Every field has a ``description`` for operators (unit, what unset means): ``python -m
aegis_devstack.configref`` writes docs/configuration-reference.md and
:mod:`aegis_runtime.settings_names` from them. Durations end in ``_s`` (seconds), ``_ms``,
``_hours`` or ``_days``; a setting of one service carries that service's prefix, so one value in a
shared settings file never lands in another service that means something else by it. A renamed
variable keeps its old name for one release as a deprecated alias, listed after the new one:
``validation_alias=AliasChoices("AEGIS_NEW_NAME", "AEGIS_OLD_NAME")`` (the process logs
``deprecated_setting`` at start when the old one is set).
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from aegis_contracts.ttl import TtlSettings
from aegis_storage.clients import AwsConfig

# raw events one factory and source may have waiting (AEGIS_NATS_RAW_MAX_PER_FACTORY)
RAW_MAX_PER_FACTORY = 100_000


def comma_list(value: object) -> object:
    """A list setting given as ``a,b,c`` (an environment variable) as the list ``[a, b, c]``;
    anything else as it is. Use with ``NoDecode`` and a ``mode="before"`` validator."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class AegisSettings(BaseSettings):
    """Every process's ``AEGIS_*`` settings. Unknown ``AEGIS_*`` variables are ignored here (a
    shared settings file holds other services' too) and reported at start when no AEGIS component
    reads them (:mod:`aegis_runtime.envcheck`)."""

    model_config = SettingsConfigDict(
        env_prefix="AEGIS_",
        env_file=None,
        extra="ignore",
        secrets_dir=None,
        validate_default=True,
        # a field with aliases (a renamed variable) is still set by its name in code and tests
        validate_by_name=True,
    )

    service: str = Field(
        default="aegis",
        description="The name this process reports in its logs, metrics, heartbeats and dead "
        "letters. Default: the component's own name (`aegis up` sets it for each child); set it "
        "per process only, never in a settings file several services share.",
    )
    state_dir: Path | None = Field(
        default=None,
        description="Where a process keeps files of its own (a migration's journal). Unset: "
        "`$XDG_STATE_HOME/aegis`, else `~/.local/state/aegis`; never the working directory. The "
        "images set `/var/lib/aegis` (a volume): their `/app` is read-only.",
    )
    aws_endpoint_url: str | None = Field(
        default=None,
        description="The S3 and DynamoDB endpoint. Unset: the real AWS endpoints of "
        "`AEGIS_REGION`; `make run` and the tests point it at an emulator.",
    )
    region: str = Field(default="ap-south-1", description="AWS region of the bucket and table.")
    aws_max_attempts: int = Field(
        default=5,
        ge=1,
        le=10,
        description="Attempts at each S3 or DynamoDB request (the first and its retries, with "
        "exponential back-off and jitter) before it is given up: a command then exits 5. Ingest "
        "makes 3 by default: it retries each message itself (`AEGIS_INGEST_RETRY_ATTEMPTS`).",
    )
    bucket: str = Field(default="aegis-bucket-data", description="The S3 data bucket.")
    table: str = Field(
        default="AEGIS-DynamoDB-FactoryStatus", description="The DynamoDB read-model table."
    )
    fleet_index_check_s: float = Field(
        default=600.0,
        gt=0,
        description="The processor and the alert dispatcher: seconds between their checks "
        "whether the table asks them to give the fleet index keys to items written before the "
        "index (`aegis bootstrap` asks when it adds the index, or with `--reindex`); each also "
        "checks at start.",
    )
    mqtt_url: str = Field(
        default="mqtt://127.0.0.1:1883",
        description="The device broker: `mqtt://host:port`, or `mqtts://host:port` for TLS "
        "(port 8883 when none is given). A `user:password@` in it is used unless "
        "`AEGIS_MQTT_USERNAME` and `AEGIS_MQTT_PASSWORD` are set.",
    )
    mqtt_username: str | None = Field(
        default=None,
        description="This process's broker identity (`aegis devices add`); it wins over a user "
        "in `AEGIS_MQTT_URL`. Unset: the URL's user, else anonymous (the development broker).",
    )
    mqtt_password: SecretStr | None = Field(
        default=None,
        description="The password of that identity, from a secret store; it wins over a "
        "password in `AEGIS_MQTT_URL`.",
    )
    mqtt_ca_file: Path | None = Field(
        default=None,
        description="The CA that signed the broker's TLS certificate; setting it turns TLS on. "
        "Unset: the system's trust store verifies an `mqtts://` broker.",
    )
    nats_url: str = Field(
        default="nats://127.0.0.1:4222",
        description="NATS with JetStream: one server or several, comma-separated; `tls://` "
        "URLs connect over TLS. The identity never goes in the URL (`AEGIS_NATS_USER`).",
    )
    nats_user: str | None = Field(
        default=None,
        description="This process's NATS identity, which decides what it may publish and "
        "consume (`aegis nats-auth`). Unset: connect without one (a local server that asks for "
        "none).",
    )
    nats_password: SecretStr | None = Field(
        default=None, description="The password of `AEGIS_NATS_USER`, from a secret store."
    )
    nats_connect_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds an `aegis` command waits for its first connection to NATS before "
        "it gives up with a message naming the URL. Services keep trying instead: without "
        "their queue they are not ready, not dead.",
    )
    nats_ping_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between the pings each NATS connection sends its server. A "
        "connection whose pings go unanswered `AEGIS_NATS_MAX_OUTSTANDING_PINGS` times running "
        "is dropped and made again (to another server of `AEGIS_NATS_URL` when one answers): a "
        "server cut off without a word (a partition, a half-open TCP connection) is noticed "
        "within (that count + 1) x this, 15 s with the defaults, where nats-py's own defaults "
        "took up to 6 minutes.",
    )
    nats_max_outstanding_pings: int = Field(
        default=2,
        ge=1,
        le=100,
        description="Unanswered pings in a row after which a NATS connection counts as dead.",
    )
    nats_manage_streams: bool = Field(
        default=True,
        description="true: create the JetStream streams and bring them up to date at every "
        "start (a server without identities, `make run`). false: only check that they exist; "
        "with identities only the admin (`aegis streams`) manages the streams.",
    )
    nats_tls_ca_file: Path | None = Field(
        default=None,
        description="The CA that signed the NATS servers' certificates; setting it turns TLS "
        "on. Unset: the system's trust store verifies `tls://` servers.",
    )
    nats_tls_ca_pem: str | None = Field(
        default=None,
        description="The same CA as PEM text, where no file can be mounted (ECS on Fargate: an "
        "SSM parameter); setting it turns TLS on.",
    )
    nats_tls_cert_file: Path | None = Field(
        default=None,
        description="A client certificate (PEM), for NATS servers that ask for one.",
    )
    nats_tls_key_file: Path | None = Field(
        default=None,
        description="The private key of `AEGIS_NATS_TLS_CERT_FILE`. Unset: the key is in the "
        "certificate file.",
    )
    nats_stream_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="Replicas of each JetStream stream (3 on a three-node cluster). Every start "
        "creates the streams or brings them up to this; a start never lowers replicas, max age "
        "or max bytes an operator raised. A cluster that cannot place that many replicas yet (still "
        "forming) is asked again for 30 s before the start fails.",
    )
    nats_stream_max_bytes: dict[str, int] = Field(
        default_factory=dict,
        description='Bytes each stream may hold, by stream name, as JSON (e.g. `{"AEGIS_RAW": '
        "10737418240}`). A stream not named: unbounded.",
    )
    nats_raw_max_per_factory: int = Field(
        default=RAW_MAX_PER_FACTORY,
        ge=1,
        description="Raw events one factory and source may have waiting in `AEGIS_RAW`. The next "
        "one is refused (an older one is not dropped): ingest dead-letters it as `queue_full` and "
        "its raw object stays for `aegis replay`, so a flooding factory cannot fill the queue for "
        "the others.",
    )
    slack_webhook_url: SecretStr | None = Field(
        default=None,
        description="Slack incoming webhook of the alerts and of the jobs' Slack steps, from a "
        "secret store. Unset: alerts are only logged.",
    )
    dashboard_url: str = Field(
        default="http://127.0.0.1:8080",
        description="Where operators open the dashboard: the base of the links in Slack alerts.",
    )

    # the TTLs in hours keep the names of the legacy data pipeline's variables
    history_ttl_hours: float = Field(
        default=2, gt=0, description="Lifetime of the HISTORY#STATE items, hours."
    )
    graph_bucket_ttl_hours: float = Field(
        default=48, gt=0, description="Lifetime of the GRAPH#5M items (the graph windows), hours."
    )
    cloud_fast_history_ttl_hours: float = Field(
        default=6, gt=0, description="Lifetime of the HISTORY#FAST items, hours."
    )
    cloud_slow_history_ttl_hours: float = Field(
        default=24, gt=0, description="Lifetime of the HISTORY#SLOW items, hours."
    )
    alert_state_ttl_s: int = Field(
        default=604_800,
        gt=0,
        validation_alias=AliasChoices("AEGIS_ALERT_STATE_TTL_S", "AEGIS_ALERT_STATE_TTL_SECONDS"),
        description="Lifetime of the ALERT# items (what was sent, for the cooldowns), seconds: "
        "7 days.",
    )
    aggregate_delay_s: float = Field(
        default=15.0,
        ge=0,
        le=240,
        description="Seconds after a 5-minute window ends before the aggregator folds it (late "
        "commits land first). The processor marks a factory-hour for folding again when it "
        "writes an object into an hour that ended longer ago than this (less a margin for the "
        "hosts' clocks): one setting, so the two cannot disagree.",
    )

    tracing: Literal["off", "otlp"] = Field(
        default="off",
        description="`otlp`: one OpenTelemetry trace per device message, from ingest through "
        "the queue to the processor, the alert dispatcher and the orchestrator, exported over "
        "OTLP/HTTP to the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or "
        "`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; headers from `OTEL_EXPORTER_OTLP_HEADERS`). "
        "`off`: no spans are made.",
    )
    log_format: Literal["auto", "json", "console"] = Field(
        default="auto",
        description="`json` lines, `console`, or `auto`: console on a terminal, JSON otherwise.",
    )
    log_level: str = Field(
        default="INFO", description="`DEBUG`, `INFO`, `WARNING`, `ERROR` or `CRITICAL`."
    )
    health_host: str = Field(
        default="127.0.0.1",
        description="Address of `/healthz`, `/readyz` and `/metrics`: `0.0.0.0` where probes and "
        "Prometheus reach the container.",
    )
    health_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="Port of `/healthz`, `/readyz` and `/metrics`; 0: any free port (the "
        "images: 8081).",
    )
    max_concurrency: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="Messages one process handles at once; also sizes its AWS connection pool.",
    )
    heartbeat_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds between the heartbeats every replica publishes on "
        "`aegis.heartbeat.{service}.{instance}` (the cloud collector's SERVICE_DOWN).",
    )
    graceful_timeout_s: float = Field(
        default=20.0,
        gt=0,
        description="On stop, seconds in-flight messages get to finish before their handlers are "
        "cancelled (the services with JetStream consumers; ingest has "
        "`AEGIS_INGEST_SHUTDOWN_GRACE_S`).",
    )

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
            alert_state_ttl_seconds=self.alert_state_ttl_s,
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
            max_attempts=self.aws_max_attempts,
        )
