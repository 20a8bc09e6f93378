"""Fixtures of the orchestrator's tests: settings for the test's own servers and foundation, and
jobs as a test needs them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from aegis_devstack.testing.storage import Foundation
from aegis_orchestration.model import Job
from aegis_orchestrator.settings import OrchestratorSettings


@pytest.fixture
def make_settings(
    nats_url: str, aws_endpoint: str, foundation: Foundation, unique_id: str
) -> Callable[..., OrchestratorSettings]:
    """Orchestrator settings on the session's servers and the test's bucket, table and durable
    consumers; no jobs file, schedules ticking once an hour, fetches of 0.2 s, the local webhook
    stand-in allowed; ``extra`` settings instead of these."""

    def make(**extra: Any) -> OrchestratorSettings:
        defaults: dict[str, Any] = {
            "nats_url": nats_url,
            "aws_endpoint_url": aws_endpoint,
            "bucket": foundation.bucket,
            "table": foundation.table,
            "orchestrator_durable": f"orch-{unique_id}",
            "orchestrator_jobs_file": "",
            "orchestrator_schedule_tick_s": 3600,
            # a stop waits out the fetch in progress (nothing delivered is dropped): a short
            # fetch keeps each test's stop short; the default (1 s) is what production waits
            "orchestrator_fetch_timeout_s": 0.2,
            "heartbeat_interval_s": 60,
            "job_egress_allow": ["127.0.0.1"],  # the webhook stand-in is local http
        }
        return OrchestratorSettings(**(defaults | extra))

    return make


@pytest.fixture
def every_minute_job() -> Callable[..., Job]:
    """A Schedule job due every minute (a missed run skipped), ``overlap`` runs of it allowed at
    once, with ``steps`` (the first one is where it starts)."""

    def make(job_id: str, *, overlap: int, steps: list[dict[str, Any]]) -> Job:
        first, *rest = steps
        return Job.model_validate(
            {
                "id": job_id,
                "job_name": job_id,
                "trigger_type": "Schedule",
                "trigger_cron": "* * * * *",
                "misfire_policy": "SKIP",
                "overlap_allowed": overlap,
                "steps": [{**first, "is_start_point": True}, *rest],
            }
        )

    return make
