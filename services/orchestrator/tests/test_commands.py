"""RUN_COMMAND runs only what is both allowed and installed: an image without a command's
package refuses the step with that reason instead of starting a process that cannot work."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

import pytest

from aegis_orchestration.model import Job, JobStep, TaskKind
from aegis_orchestrator.egress import EgressPolicy
from aegis_orchestrator.tasks import TaskFailed, Tasks, installed_commands


def tasks(allowed: list[str], installed: set[str]) -> Tasks:
    return Tasks(
        session=cast("Any", None),
        readmodel=cast("Any", None),
        publish=cast("Any", None),
        clock=lambda: datetime.now(UTC),
        slack_webhook_url=None,
        commands=allowed,
        command_timeout=5,
        egress=EgressPolicy.parse([], max_response_bytes=1024),
        installed=lambda: installed,
    )


async def run(t: Tasks, command: str) -> Any:
    executor = t.executors(cast("Job", None), "exec-1")[TaskKind.RUN_COMMAND]
    return await executor(cast("JobStep", None), {"command": command}, {}, key="k")


async def test_an_allowed_command_missing_from_the_image_is_refused_with_that_reason():
    t = tasks(["report", "status"], installed={"status", "bootstrap"})
    assert t.commands == {"status"} and t.absent == {"report"}
    with pytest.raises(TaskFailed, match="allowed but not installed"):
        await run(t, "report")
    with pytest.raises(TaskFailed, match="not allowed"):
        await run(t, "bootstrap")  # installed, not allowed


def test_installed_commands_are_the_cli_s_own_and_its_plugins():
    found = installed_commands()
    assert {"status", "bootstrap", "devices"} <= found  # built in
    assert {"report", "aggregate", "replay"} <= found  # the workspace has every service
