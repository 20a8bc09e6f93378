"""TASK executors: Slack, HTTP webhook, publish a system event, run an allow-listed ``aegis``
subcommand, query the read model. Each raises on failure; the engine retries and catches.

Side effects carry an idempotency key derived from the execution id and the run of the step
(:func:`idempotency_key`): the ``Idempotency-Key`` header of Slack and webhook calls, the
``Nats-Msg-Id`` of published events. A step resumed on another replica, or retried, sends the
same key, so a receiver that honours it acts once."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sys
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

import aiohttp

from aegis_contracts import msgids
from aegis_contracts.events import SystemEvent
from aegis_contracts.subjects import system_subject
from aegis_orchestration.engine import Executor
from aegis_orchestration.model import Job, JobStep, TaskKind
from aegis_orchestration.query import EMPTY, QuerySpec, build_query
from aegis_orchestrator.egress import EgressPolicy, EgressRefused
from aegis_runtime.redact import redact_url
from aegis_storage.readmodel import ReadModel


class Publish(Protocol):
    """``ServiceApp.publish``: an event on a subject, de-duplicated by ``msg_id``."""

    def __call__(self, subject: str, event: SystemEvent, *, msg_id: str) -> Awaitable[bool]: ...


SERVICE = "orchestrator"
IDEMPOTENCY_HEADER = "Idempotency-Key"
_KEY_BYTES = 200


def idempotency_key(execution_id: str, occurrence: str) -> str:
    """``{execution_id}:{occurrence}`` (``…:respond.1/call_maintenance.1``); a digest of it when
    deep nesting would make it long."""
    key = f"{execution_id}:{occurrence}"
    if len(key) <= _KEY_BYTES:
        return key
    return f"{execution_id}:{hashlib.sha256(occurrence.encode()).hexdigest()}"


class TaskFailed(Exception):
    pass


def installed_commands() -> set[str]:
    """The ``aegis`` subcommands this installation has (built in, and those the installed
    packages add through the ``aegis.commands`` entry points)."""
    from aegis_cli.app import command_names  # noqa: PLC0415 - the CLI, only when a job may use it

    return set(command_names())


class Tasks:
    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        readmodel: ReadModel,
        publish: Publish,
        clock: Callable[[], datetime],
        slack_webhook_url: str | None,
        commands: list[str],
        command_timeout: float,
        egress: EgressPolicy,
        installed: Callable[[], set[str]] | None = None,
    ) -> None:
        self.session = session
        self.egress = egress
        self.readmodel = readmodel
        self.publish = publish
        self.clock = clock
        self.slack_webhook_url = slack_webhook_url
        # allowed and present in this image: an allowed command that is not installed (its
        # service's package is absent) is refused with that reason, not run to fail
        present = (installed or installed_commands)()
        self.commands = set(commands) & present
        self.absent = set(commands) - present
        self.command_timeout = command_timeout

    def executors(self, job: Job, execution_id: str) -> dict[TaskKind, Executor]:
        async def slack(
            step: JobStep, params: dict[str, Any], _: Mapping[str, Any], *, key: str
        ) -> Any:
            url = params.get("webhook_url") or self.slack_webhook_url
            if not url:
                return {"delivered": False, "reason": "no webhook configured"}
            body = {k: v for k, v in params.items() if k in ("text", "blocks", "channel")}
            return await self._post(str(url), body, key=idempotency_key(execution_id, key))

        async def webhook(
            step: JobStep, params: dict[str, Any], _: Mapping[str, Any], *, key: str
        ) -> Any:
            return await self._post(
                str(params.get("url", "")),
                params.get("body", {}),
                method=params.get("method", "POST"),
                key=idempotency_key(execution_id, key),
            )

        async def publish(
            step: JobStep, params: dict[str, Any], _: Mapping[str, Any], *, key: str
        ) -> Any:
            kind = str(params.get("kind", ""))
            detail = params.get("detail") or {}
            event = SystemEvent(
                kind=kind,
                producer=SERVICE,
                at=self.clock(),
                detail={
                    **(detail if isinstance(detail, dict) else {"value": detail}),
                    "job_id": job.id,
                    "execution_id": execution_id,
                },
            )
            subject = system_subject(kind)
            msg_id = msgids.orchestration(idempotency_key(execution_id, key))
            duplicate = await self.publish(subject, event, msg_id=msg_id)
            return {"subject": subject, "duplicate": duplicate}

        async def command(
            step: JobStep, params: dict[str, Any], _: Mapping[str, Any], *, key: str
        ) -> Any:
            return await self._command(params)

        async def query(
            step: JobStep, params: dict[str, Any], _: Mapping[str, Any], *, key: str
        ) -> Any:
            spec = build_query(job.conditions_of(step.id), params)
            found = await read_query(self.readmodel, spec, now=self.clock())
            return {"items": found, "count": len(found)}

        return {
            TaskKind.SLACK_NOTIFY: slack,
            TaskKind.HTTP_WEBHOOK: webhook,
            TaskKind.PUBLISH_EVENT: publish,
            TaskKind.RUN_COMMAND: command,
            TaskKind.READ_MODEL_QUERY: query,
        }

    async def _post(self, url: str, body: Any, *, key: str, method: str = "POST") -> dict[str, Any]:
        """One call under the egress policy: no redirects, at most ``max_response_bytes`` read."""
        method = str(method).upper()
        try:
            target = self.egress.check_request(url, method)
            async with self.session.request(
                method,
                target,
                json=body,
                headers={IDEMPOTENCY_HEADER: key},
                timeout=aiohttp.ClientTimeout(total=30),
                allow_redirects=False,
            ) as resp:
                cap = self.egress.max_response_bytes
                raw = await resp.content.read(cap + 1)
                truncated = len(raw) > cap
                try:
                    text = raw[:cap].decode(resp.charset or "utf-8", errors="replace")[:2000]
                except LookupError:  # a charset Python does not know
                    text = raw[:cap].decode("utf-8", errors="replace")[:2000]
                if 300 <= resp.status < 400:
                    where = redact_url(resp.headers.get("Location", "?"))
                    raise TaskFailed(
                        f"HTTP {resp.status} redirect to {where!r:.200} refused: job steps do "
                        "not follow redirects (call the final URL)"
                    )
                if not 200 <= resp.status < 300:
                    raise TaskFailed(f"HTTP {resp.status}: {text[:200]}")
                return {"status": resp.status, "body": text, "truncated": truncated}
        except EgressRefused as err:
            raise TaskFailed(f"egress refused: {err}") from None
        except aiohttp.ClientConnectorError as err:
            if isinstance(err.os_error, EgressRefused):
                raise TaskFailed(f"egress refused: {err.os_error}") from None
            raise

    async def _command(self, params: dict[str, Any]) -> dict[str, Any]:
        """``aegis {command} {args}`` in a child process, output captured, time bounded."""
        name = str(params.get("command", ""))
        if name in self.absent:
            raise TaskFailed(
                f"command {name!r} is allowed but not installed where the orchestrator runs: "
                "run it from an image that has it (and the role its storage calls need)"
            )
        if name not in self.commands:
            raise TaskFailed(
                f"command {name!r} is not allowed ({', '.join(sorted(self.commands))})"
            )
        args = params.get("args") or []
        if not isinstance(args, list) or not all(isinstance(a, str | int | float) for a in args):
            raise TaskFailed("args must be a list of strings")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "aegis_cli.app",
            name,
            *[str(a) for a in args],
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.command_timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise TaskFailed(f"aegis {name} ran over {self.command_timeout}s") from None
        text = out.decode(errors="replace")[-4000:]
        if proc.returncode:
            raise TaskFailed(f"aegis {name} exited {proc.returncode}: {text[-500:]}")
        return {"exit_code": proc.returncode, "output": text}


async def read_query(
    readmodel: ReadModel, spec: QuerySpec, *, now: datetime
) -> list[dict[str, Any]]:
    """A READ_MODEL_QUERY's answer, reading only the range of the partition that can hold it
    (:meth:`QuerySpec.plan`) and, when the order is the sort key's, only until it is complete."""
    plan = spec.plan()
    if plan.key_condition == EMPTY:
        return []
    kept: list[dict[str, Any]] = []
    pages = contextlib.aclosing(
        readmodel.query_pages(
            spec.pk,
            now=now,
            sk_condition=plan.key_condition,
            filter_expression=plan.filter,
            names=plan.names,
            values=plan.values,
            projection=plan.projection,
            forward=plan.forward,
            page_size=spec.limit if plan.stops_early else None,
        )
    )
    async with pages as read:
        async for page in read:
            kept.extend(i for i in page if spec.matches(i))
            if plan.stops_early and len(kept) >= spec.limit:
                break
    return spec.apply(kept)
