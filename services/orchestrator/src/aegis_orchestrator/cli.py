"""``aegis jobs``: register, list, show, enable, disable, delete (soft), export, import (YAML),
export-asl, runs. Every change is written to the read model, then announced on
``aegis.changes.orch_job`` so running orchestrators refresh that job at once (without NATS they
pick it up at their next periodic refresh). Exit codes: 0 done, 1 refused or failed, 2 not found.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import nats
import typer

from aegis_contracts import keys
from aegis_contracts.events import ChangeEvent
from aegis_contracts.subjects import change_subject
from aegis_contracts.times import utc_now
from aegis_orchestration.asl import DEFAULT_FUNCTION_ARN, AslExportError, export_asl
from aegis_orchestration.model import Job
from aegis_orchestration.yamlio import JobFileError, dump_jobs, load_jobs
from aegis_orchestrator.settings import OrchestratorSettings
from aegis_orchestrator.store import DuplicateJob, JobNotFound, JobStore
from aegis_runtime.broker import connect_options
from aegis_storage.clients import open_clients
from aegis_storage.errors import Conflict, StorageError
from aegis_storage.readmodel import ReadModel

app = typer.Typer(
    help="Orchestration jobs (seed 003): triggers and workflows.", no_args_is_help=True
)
EXIT_REFUSED = 1
EXIT_NOT_FOUND = 2
T = TypeVar("T")


def _run(work: Callable[[JobStore], Awaitable[T]]) -> T:
    settings = OrchestratorSettings()

    async def go() -> T:
        async with open_clients(settings.aws()) as clients:
            return await work(JobStore(ReadModel(clients.dynamodb, settings.table), utc_now))

    try:
        return asyncio.run(go())
    except (DuplicateJob, Conflict, JobFileError) as err:
        typer.echo(f"jobs: refused: {err}", err=True)
        raise typer.Exit(EXIT_REFUSED) from None
    except JobNotFound as err:
        typer.echo(f"jobs: no job {err}", err=True)
        raise typer.Exit(EXIT_NOT_FOUND) from None
    except StorageError as err:
        typer.echo(f"jobs: storage failed: {err}", err=True)
        raise typer.Exit(EXIT_REFUSED) from None


def announce(job_ids: list[str], settings: OrchestratorSettings | None = None) -> bool:
    """Tell running orchestrators that these jobs changed; False when NATS is unreachable."""
    s = settings or OrchestratorSettings()

    async def go() -> None:
        nc = await nats.connect(
            **connect_options(s),
            connect_timeout=2,
            max_reconnect_attempts=0,
        )
        try:
            for job_id in job_ids:
                event = ChangeEvent(
                    table=s.table,
                    pk=keys.JOB_REGISTRY_PK,
                    sk=keys.job_sk(job_id),
                    event_name="MODIFY",
                    producer="aegis-jobs",
                    at=utc_now(),
                )
                await nc.publish(change_subject("orch_job"), event.model_dump_json().encode())
            await nc.flush()
        finally:
            await nc.close()

    try:
        asyncio.run(go())
    except Exception as err:
        typer.echo(
            f"jobs: NATS not reachable ({type(err).__name__}); orchestrators refresh within a minute",
            err=True,
        )
        return False
    return True


def _read(path: Path) -> list[Job]:
    try:
        return load_jobs(path.read_text())
    except JobFileError as err:
        for problem in err.problems:
            typer.echo(f"  {problem}", err=True)
        typer.echo(f"jobs: {path} refused", err=True)
        raise typer.Exit(EXIT_REFUSED) from None


@app.command()
def register(
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="A jobs YAML file.")],
    replace: Annotated[bool, typer.Option("--replace", help="Overwrite jobs that exist.")] = False,
) -> None:
    """Register the jobs of a YAML file (duplicates and invalid jobs are refused)."""
    jobs = _read(path)

    async def work(store: JobStore) -> list[Job]:
        return [await store.register(j, replace=replace) for j in jobs]

    done = _run(work)
    for job in done:
        typer.echo(f"registered {job.id} v{job.version}")
    announce([j.id for j in done])


app.command(name="import")(register)


@app.command(name="list")
def list_jobs(
    all_jobs: Annotated[bool, typer.Option("--all", help="Include soft-deleted jobs.")] = False,
) -> None:
    """The registered jobs: trigger, state, steps."""
    jobs = _run(lambda store: store.all())
    for j in sorted(jobs, key=lambda j: j.id):
        if not j.is_active and not all_jobs:
            continue
        state = "deleted" if not j.is_active else ("enabled" if j.is_enabled else "disabled")
        trigger = j.trigger_cron if j.trigger_cron else "/".join(j.trigger_key()[1:])
        typer.echo(
            f"{j.id:<28} {state:<9} {j.trigger_type.value:<11} {trigger:<32} {len(j.steps)} steps"
        )


async def _get(store: JobStore, job_id: str) -> Job:
    job = await store.get(job_id)
    if job is None:
        raise JobNotFound(job_id)
    return job


@app.command()
def show(job_id: str) -> None:
    """One job as YAML."""
    typer.echo(dump_jobs([_run(lambda store: _get(store, job_id))]), nl=False)


def _flag(job_id: str, **changes: Any) -> None:
    job = _run(lambda store: store.update(job_id, **changes))
    typer.echo(
        f"{job.id}: " + ", ".join(f"{k}={v}" for k, v in changes.items()) + f" (v{job.version})"
    )
    announce([job_id])


@app.command()
def enable(job_id: str) -> None:
    """Let the job's trigger fire again."""
    _flag(job_id, is_enabled=True)


@app.command()
def disable(job_id: str) -> None:
    """Stop the job's trigger (the operator's toggle; the job stays)."""
    _flag(job_id, is_enabled=False)


@app.command()
def delete(job_id: str) -> None:
    """Soft-delete the job (is_active = false); `list --all` still shows it."""
    _flag(job_id, is_active=False)


@app.command()
def export(
    out: Annotated[Path | None, typer.Option("--out", help="Write here instead of stdout.")] = None,
) -> None:
    """Every active job as YAML, to promote them to another environment with `import`."""
    jobs = [j for j in _run(lambda store: store.all()) if j.is_active]
    text = dump_jobs(jobs)
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)
        typer.echo(f"exported {len(jobs)} jobs to {out}")


@app.command(name="export-asl")
def export_asl_command(
    job_id: str,
    function_arn: Annotated[
        str, typer.Option(help="The task function's Lambda ARN.")
    ] = DEFAULT_FUNCTION_ARN,
) -> None:
    """The job as an Amazon States Language definition (Step Functions)."""
    job = _run(lambda store: _get(store, job_id))
    try:
        typer.echo(json.dumps(export_asl(job, function_arn=function_arn), indent=2))
    except AslExportError as err:
        typer.echo(f"jobs: {job_id} cannot be exported: {err}", err=True)
        raise typer.Exit(EXIT_REFUSED) from None


@app.command()
def runs(
    job_id: str,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 20,
    json_output: Annotated[bool, typer.Option("--json", help="Whole log items as JSON.")] = False,
) -> None:
    """The job's latest executions from the execution log (30 days)."""
    items = _run(lambda store: store.executions(job_id, limit=limit))
    if json_output:
        typer.echo(json.dumps(items, indent=2, default=str))
        return
    for item in items:
        steps = " ".join(f"{s['step_id']}:{s['status']}" for s in item.get("steps", []))
        typer.echo(f"{item['started_at']} {item['execution_id']} {item['status']:<16} {steps}")
