"""The simulator as a service (``make run`` / ``aegis up``): the demo fleet at the default rates, a
recurring scenario now and then, health endpoints, reconnects, graceful stop on SIGTERM.

Settings beyond the common ones: ``AEGIS_SIMULATOR_FACTORIES`` (comma list), ``AEGIS_SIMULATOR_SCENARIOS``
(``NAME[@FACTORY][+DELAY_S][:DURATION_S][/EVERY_S]``, comma-separated; ``off`` for none; default a gas
leak on factory-b for 4 minutes every 10 minutes), ``AEGIS_SIMULATOR_SEED``, ``AEGIS_SIMULATOR_QOS``,
``AEGIS_SIMULATOR_IMAGES``.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from pydantic import Field

from aegis_runtime.health import HealthServer
from aegis_runtime.lifecycle import run_service
from aegis_runtime.logging import configure
from aegis_runtime.metrics import Metrics
from aegis_runtime.settings import AegisSettings
from aegis_simulator.domain import factory_ids, parse_scenarios
from aegis_simulator.runner import (
    BrokerLost,
    BrokerUnreachable,
    MqttTarget,
    RunOptions,
    Stats,
    run,
)

log = structlog.get_logger(__name__)

DEFAULT_SCENARIOS = "gas_leak@factory-b+300:240/600"
RECONNECT_MAX_S = 30.0


class SimulatorSettings(AegisSettings):
    service: str = "simulator"
    simulator_factories: str = Field(
        default="factory-a,factory-b,factory-c",
        description="The factories simulated, comma-separated.",
    )
    simulator_scenarios: str = Field(
        default=DEFAULT_SCENARIOS,
        description="Recurring scenarios, comma-separated "
        "`NAME[@FACTORY][+DELAY_S][:DURATION_S][/EVERY_S]`; `off`: none. Default: a gas leak on "
        "factory-b for 4 minutes every 10 minutes.",
    )
    simulator_seed: int | None = Field(
        default=None,
        description="Makes the simulated values repeatable: the same number, the same run. "
        "Unset: a different run each time.",
    )
    simulator_qos: int = Field(
        default=1, ge=0, le=2, description="The MQTT QoS of the simulated devices' messages."
    )
    simulator_images: bool = Field(
        default=True,
        description="Upload the simulated cameras' images to the bucket (as a gateway does).",
    )

    def run_options(self) -> RunOptions:
        return RunOptions(
            factories=factory_ids(self.simulator_factories),
            scenarios=parse_scenarios([self.simulator_scenarios]),
            seed=self.simulator_seed,
            qos=self.simulator_qos,
            images=self.simulator_images,
        )


async def serve(settings: SimulatorSettings, stop: asyncio.Event) -> None:
    """Simulate until ``stop``; a lost or unreachable broker is retried with backoff."""
    options = settings.run_options()
    metrics = Metrics(settings.service)
    connected = asyncio.Event()

    async def ready() -> bool:
        return connected.is_set()

    health = HealthServer(metrics, settings.health_host, settings.health_port)
    health.add_check("mqtt", ready)
    backoff = 1.0
    async with health:
        while not stop.is_set():
            stats = Stats()
            try:
                await run(
                    options,
                    mqtt_url=MqttTarget.from_settings(settings),
                    aws=settings.aws(),
                    bucket=settings.bucket,
                    stop=stop,
                    stats=stats,
                    on_connected=connected.set,
                )
            except (BrokerUnreachable, BrokerLost) as err:
                log.warning("broker_unavailable", error=str(err), retry_in_s=backoff)
            finally:
                connected.clear()
                metrics.messages_total.labels(consumer="simulator", outcome="ok").inc(
                    stats.total_sent
                )
                for _kind, n in stats.errors.items():
                    metrics.messages_total.labels(consumer="simulator", outcome="failed").inc(n)
            if stats.total_sent:
                backoff = 1.0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=backoff)
            backoff = min(RECONNECT_MAX_S, backoff * 2)


def main() -> None:
    settings = SimulatorSettings()
    configure(settings.log_format, settings.log_level)
    structlog.contextvars.bind_contextvars(service=settings.service)
    run_service(lambda stop: serve(settings, stop))
