"""``aegis jobs``: register, list, show, enable, disable, delete (soft), export, import (YAML, or
relational tables with ``--tables``), export-asl, export-sfn, runs. Every change is written to
the read model, then announced on
``aegis.changes.orch_job`` (INSERT or MODIFY, with the job's old and new images: BizObject jobs on
``orch_job`` see them) so running orchestrators refresh that job at once (without NATS they
pick it up at their next periodic refresh). Exit codes: 0 done, 1 refused or failed, 2 not
found, 5 S3/DynamoDB not reachable (:mod:`aegis_cli.exitcodes`); ``validate``: 0 valid, 1 not.

Import-light: ``aegis --help`` imports this module, so the SDKs are imported in the commands.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from aegis_cli import exitcodes

if TYPE_CHECKING:
    from aegis_orchestration.model import Job
    from aegis_orchestration.store import JobStore
    from aegis_orchestration.tables import Planned, TableProblem, TablesResult
    from aegis_orchestration.tenants import Tenants
    from aegis_orchestrator.settings import OrchestratorSettings
    from aegis_storage.items import Change

app = typer.Typer(help="Orchestration jobs: triggers and workflows.", no_args_is_help=True)
EXIT_REFUSED = exitcodes.FAILED
EXIT_NOT_FOUND = 2
EXIT_INVALID = exitcodes.FAILED
EXIT_CODES = (
    "Exit codes: 0 done, 1 refused or failed, 2 no such job (or bad options), 5 S3/DynamoDB not "
    "reachable."
)
T = TypeVar("T")
# aegis_orchestration.asl.DEFAULT_FUNCTION_ARN, which a test holds equal (an option's default is
# read when the help is built: the asl module is not imported for that)
DEFAULT_FUNCTION_ARN = "arn:aws:lambda:ap-south-1:000000000000:function:aegis-orchestrator-task"


def _run(work: Callable[[JobStore], Awaitable[T]], changes: list[Change] | None = None) -> T:
    """Run ``work`` on the job store; the job changes it writes land in ``changes``."""
    from aegis_contracts.times import utc_now  # noqa: PLC0415 - import-light module
    from aegis_orchestration.store import DuplicateJob, JobNotFound, JobStore  # noqa: PLC0415
    from aegis_orchestration.yamlio import JobFileError  # noqa: PLC0415
    from aegis_orchestrator.settings import OrchestratorSettings  # noqa: PLC0415
    from aegis_storage.clients import open_clients  # noqa: PLC0415
    from aegis_storage.errors import Conflict, StorageError  # noqa: PLC0415
    from aegis_storage.readmodel import ReadModel  # noqa: PLC0415

    settings = OrchestratorSettings()

    async def keep(change: Change) -> None:
        if changes is not None:
            changes.append(change)

    async def go() -> T:
        async with open_clients(settings.aws()) as clients:
            readmodel = ReadModel(clients.items, settings.table, changes=keep)
            return await work(JobStore(readmodel, utc_now))

    try:
        return asyncio.run(go())
    except (DuplicateJob, Conflict, JobFileError) as err:
        typer.echo(f"jobs: refused: {err}", err=True)
        raise typer.Exit(EXIT_REFUSED) from None
    except JobNotFound as err:
        typer.echo(f"jobs: no job {err}", err=True)
        raise typer.Exit(EXIT_NOT_FOUND) from None
    except StorageError as err:
        raise typer.Exit(exitcodes.report(f"jobs: storage failed: {err}", err)) from None


def announce(
    job_ids: list[str],
    settings: OrchestratorSettings | None = None,
    changes: list[Change] | None = None,
) -> bool:
    """Tell running orchestrators that these jobs changed (with the images of ``changes``, the
    writes that changed them); False when NATS is unreachable."""
    from aegis_contracts import keys  # noqa: PLC0415 - import-light module
    from aegis_contracts.events import ChangeEvent  # noqa: PLC0415
    from aegis_contracts.subjects import change_subject  # noqa: PLC0415
    from aegis_contracts.times import utc_now  # noqa: PLC0415
    from aegis_orchestrator.settings import OrchestratorSettings  # noqa: PLC0415
    from aegis_runtime import natsio  # noqa: PLC0415
    from aegis_runtime.bus import command_broker  # noqa: PLC0415

    s = settings or OrchestratorSettings()

    async def go() -> None:
        broker = await command_broker(
            s,
            name="jobs",
            connect_timeout=2,
            max_reconnect_attempts=0,
        )
        try:
            written = {c.sk: c for c in changes or ()}
            for job_id in job_ids:
                change = written.get(keys.job_sk(job_id))
                event = ChangeEvent(
                    table=s.table,
                    pk=keys.JOB_REGISTRY_PK,
                    sk=keys.job_sk(job_id),
                    event_name=change.event_name if change else "MODIFY",
                    old_image=change.old_image if change else None,
                    new_image=change.new_image if change else None,
                    producer="aegis-jobs",
                    at=utc_now(),
                )
                await broker.publish(
                    event.model_dump_json().encode(),
                    change_subject("orch_job"),
                    headers={"content-type": "application/json"},
                )
        finally:
            await natsio.close(broker)  # flushed first: the announcements are out

    try:
        asyncio.run(go())
    except Exception as err:
        typer.echo(
            f"jobs: NATS not reachable ({type(err).__name__}); orchestrators refresh within a minute",
            err=True,
        )
        return False
    return True


def _operator() -> str:
    """Who made a job's version from the command line: ``cli:`` and the login name."""
    import getpass  # noqa: PLC0415 - import-light module

    return f"cli:{getpass.getuser()}"


def _read(path: Path) -> list[Job]:
    from aegis_orchestration.yamlio import JobFileError, load_jobs  # noqa: PLC0415

    try:
        return load_jobs(path.read_text())
    except JobFileError as err:
        for problem in err.problems:
            typer.echo(f"  {problem}", err=True)
        typer.echo(f"jobs: {path} refused", err=True)
        raise typer.Exit(EXIT_REFUSED) from None


def _tenants() -> Tenants:
    """The tenants ``AEGIS_ORCHESTRATOR_TENANTS_FILE`` declares (none when unset)."""
    from aegis_orchestration.tenants import TenantsFileError, load_tenants  # noqa: PLC0415
    from aegis_orchestrator.settings import OrchestratorSettings  # noqa: PLC0415

    try:
        return load_tenants(OrchestratorSettings().orchestrator_tenants_file)
    except TenantsFileError as err:
        typer.echo(f"jobs: refused: {err}", err=True)
        raise typer.Exit(EXIT_REFUSED) from None


@app.command(epilog=EXIT_CODES)
def register(
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="A jobs YAML file.")],
    replace: Annotated[bool, typer.Option("--replace", help="Overwrite jobs that exist.")] = False,
) -> None:
    """Register the jobs of a YAML file (duplicates, invalid jobs and jobs of a tenant the
    tenants file does not declare are refused)."""
    jobs = _read(path)
    tenants = _tenants()
    undeclared = [r for j in jobs if (r := tenants.refusal(j)) is not None]
    if undeclared:
        for reason in undeclared:
            typer.echo(f"  {reason}", err=True)
        typer.echo(f"jobs: {path} refused", err=True)
        raise typer.Exit(EXIT_REFUSED)

    async def work(store: JobStore) -> list[Job]:
        return [await store.register(j, replace=replace, by=_operator()) for j in jobs]

    changes: list[Change] = []
    done = _run(work, changes)
    for job in done:
        typer.echo(f"registered {job.id} v{job.version}")
    announce([j.id for j in done], changes=changes)


IMPORT_EXIT_CODES = (
    "Exit codes: 0 done (also when nothing changed), 1 refused (nothing registered), 2 bad "
    "options or no such file or folder, 3 done with --skip-bad, and some jobs or rows were left "
    "out, 5 S3/DynamoDB not reachable."
)


@app.command(name="import", epilog=IMPORT_EXIT_CODES)
def import_jobs(  # noqa: PLR0917 - a Typer command: one parameter per option
    path: Annotated[
        Path | None,
        typer.Argument(exists=True, dir_okay=False, help="A jobs YAML file (as `register`)."),
    ] = None,
    tables: Annotated[
        Path | None,
        typer.Option(
            "--tables",
            exists=True,
            file_okay=False,
            help="A folder with the tables orch_job, orch_job_step, orch_step_param and "
            "orch_task_condition, one CSV or JSON file each, named after the table.",
        ),
    ] = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="Overwrite registered jobs that differ.")
    ] = False,
    skip_bad: Annotated[
        bool,
        typer.Option(
            "--skip-bad",
            help="With --tables: register the jobs whose rows are all good and list the rest "
            "(default: any bad row refuses the whole import).",
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="With --tables: check and print the plan; write nothing."),
    ] = False,
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help='With --tables: print {"tables", "dry_run", "changed", "jobs": [{"id", '
            '"source_id", "tenant", "action", "version", ...}], "skipped", "problems": '
            '[{"table", "row", "line", "job", "reason"}], "rows", "deleted_rows"}.',
        ),
    ] = False,
) -> None:
    """Register the jobs of a YAML file (as `register`), or of relational tables (--tables DIR).

    From tables, each job is assembled from its rows, checked as `register` checks a file, and
    registered; a job already registered as in the tables is left as it is, so importing the
    same tables twice changes nothing. Every bad row is named by table, row and line.
    """
    if (path is None) == (tables is None):
        raise typer.BadParameter("give a jobs file or --tables DIR (one of them)")
    if tables is None:
        if skip_bad or dry_run or json_output:
            raise typer.BadParameter("--skip-bad, --dry-run and --json go with --tables")
        assert path is not None
        register(path, replace=replace)
        return
    _import_tables(
        tables, replace=replace, skip_bad=skip_bad, dry_run=dry_run, json_output=json_output
    )


def _import_tables(
    directory: Path, *, replace: bool, skip_bad: bool, dry_run: bool, json_output: bool
) -> None:
    from aegis_orchestration.tables import (  # noqa: PLC0415
        Action,
        Planned,
        load_tables,
        plan_registration,
    )

    found = load_tables(directory)
    tenants = _tenants()
    report = _ImportReport(directory, found, problems=list(found.problems), dry_run=dry_run)
    changes: list[Change] = []
    if not found.fatal and (skip_bad or not found.problems):
        candidates = found.good_jobs if skip_bad else found.jobs

        async def work(store: JobStore) -> tuple[list[Planned], list[TableProblem], bool]:
            plan, refused = plan_registration(
                await store.all(),
                candidates,
                replace=replace,
                rows=found.job_rows,
                tenants=tenants,
            )
            if dry_run or (refused and not skip_bad):
                return plan, refused, False
            written = []
            for p in plan:
                if p.action is not Action.UNCHANGED:
                    stored = await store.register(
                        p.job, replace=p.action is Action.REPLACE, by=_operator()
                    )
                    p = Planned(stored, p.action, stored.version)  # noqa: PLW2901
                written.append(p)
            return written, refused, True

        report.planned, refused, report.done = _run(work, changes)
        report.problems += refused
    if report.done and report.changed:
        announce(report.changed, changes=changes)
    if json_output:
        typer.echo(json.dumps(report.document()))
    else:
        report.echo()
    if report.refused:
        raise typer.Exit(EXIT_REFUSED)
    if report.problems:
        raise typer.Exit(exitcodes.FOUND)


@dataclass
class _ImportReport:
    """What ``jobs import --tables`` did (or, with ``dry_run``, would do)."""

    directory: Path
    found: TablesResult
    problems: list[TableProblem]
    dry_run: bool
    planned: list[Planned] = field(default_factory=list)
    done: bool = False  # written

    @property
    def changed(self) -> list[str]:
        return [p.job.id for p in self.planned if p.action.value != "unchanged"]

    @property
    def refused(self) -> bool:
        """Problems, and nothing registered (or, in a dry run, nothing that would be)."""
        return bool(self.problems) and not (self.done or (self.dry_run and self.planned))

    @property
    def skipped(self) -> list[str]:
        return sorted({p.job for p in self.problems if p.job is not None})

    def document(self) -> dict[str, Any]:
        return {
            "tables": str(self.directory),
            "dry_run": self.dry_run,
            "changed": self.done and bool(self.changed),
            "jobs": [
                {
                    "id": p.job.id,
                    "source_id": p.job.source_id,
                    "tenant": p.job.tenant,
                    "action": p.action.value,
                    "version": p.version,
                    "steps": len(p.job.steps),
                    "params": len(p.job.params),
                    "conditions": len(p.job.conditions),
                    "origin": p.job.origin,
                }
                for p in self.planned
            ],
            "skipped": [] if self.refused else self.skipped,
            "problems": [p.as_dict() for p in self.problems],
            "files": self.found.files,
            "rows": self.found.rows,
            "deleted_rows": self.found.deleted,
        }

    def echo(self) -> None:
        """The jobs on stdout, one line each, then a summary; the problems on stderr."""
        for problem in self.problems:
            typer.echo(f"  {problem}", err=True)
        for p in self.planned:
            steps = (
                f"({len(p.job.steps)} steps, {len(p.job.params)} params, "
                f"{len(p.job.conditions)} conditions)"
            )
            if p.job.source_id is not None:
                steps += f" from id {p.job.source_id}"
            if p.action.value == "unchanged":
                typer.echo(f"unchanged {p.job.id} v{p.version}")
            elif self.done:
                verb = "registered" if p.action.value == "register" else "replaced"
                typer.echo(f"{verb} {p.job.id} v{p.version} {steps}")
            elif p.action.value == "register":
                typer.echo(f"would register {p.job.id} {steps}")
            else:
                typer.echo(f"would replace {p.job.id} v{p.version} {steps}")
        deleted = sum(self.found.deleted.values())
        note = f"; {deleted} deleted row(s) left out" if deleted else ""
        if self.refused:
            typer.echo(
                f"jobs import: {self.directory} refused: {len(self.problems)} problem(s); "
                "nothing registered",
                err=True,
            )
            return
        if self.planned and not self.changed:
            typer.echo(
                f"jobs import: nothing changed: {len(self.planned)} job(s) already registered "
                f"as in {self.directory}{note}"
            )
        else:
            counts = ", ".join(
                f"{sum(p.action.value == a for p in self.planned)} {a}"
                for a in ("register", "replace", "unchanged")
            )
            what = "jobs import (dry run, nothing written)" if self.dry_run else "jobs import"
            typer.echo(f"{what}: {counts} from {self.directory}{note}")
        if self.skipped:
            typer.echo(f"jobs import: left out (bad rows): {', '.join(self.skipped)}", err=True)


@app.command(name="list", epilog=EXIT_CODES)
def list_jobs(
    all_jobs: Annotated[bool, typer.Option("--all", help="Include soft-deleted jobs.")] = False,
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print a JSON list: {"id", "name", "state", "trigger_type", "trigger", "steps", '
            '"version"} per job.',
        ),
    ] = False,
) -> None:
    """The registered jobs: trigger, state, steps."""
    jobs = _run(lambda store: store.all())
    rows = []
    for j in sorted(jobs, key=lambda j: j.id):
        if not j.is_active and not all_jobs:
            continue
        state = "deleted" if not j.is_active else ("enabled" if j.is_enabled else "disabled")
        trigger = j.trigger_cron if j.trigger_cron else "/".join(j.trigger_key()[1:])
        rows.append(
            {
                "id": j.id,
                "name": j.job_name,
                "state": state,
                "trigger_type": j.trigger_type.value,
                "trigger": trigger,
                "steps": len(j.steps),
                "version": j.version,
            }
        )
    if json_output:
        typer.echo(json.dumps(rows))
        return
    for r in rows:
        typer.echo(
            f"{r['id']:<28} {r['state']:<9} {r['trigger_type']:<11} {r['trigger']:<32} "
            f"{r['steps']} steps"
        )


async def _get(store: JobStore, job_id: str) -> Job:
    from aegis_orchestration.store import JobNotFound  # noqa: PLC0415

    job = await store.get(job_id)
    if job is None:
        raise JobNotFound(job_id)
    return job


@app.command()
def show(
    job_id: str,
    json_output: Annotated[
        bool, typer.Option("--json", help="The job as a JSON document (as in a jobs file).")
    ] = False,
) -> None:
    """One job as YAML (or JSON).

    Exit codes: 0 shown, 1 failed, 2 no such job, 5 S3/DynamoDB not reachable.
    """
    from aegis_orchestration.yamlio import dump_jobs, job_document  # noqa: PLC0415

    job = _run(lambda store: _get(store, job_id))
    if json_output:
        typer.echo(json.dumps(job_document(job) | {"version": job.version}))
        return
    typer.echo(dump_jobs([job]), nl=False)


@app.command()
def validate(
    path: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, help="A jobs file, YAML or JSON.")
    ],
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print {"valid", "jobs": [ids], "problems": [{"job", "field", "reason"}]}.',
        ),
    ] = False,
) -> None:
    """Check a jobs file as `register` would, registering nothing and reading no storage.

    Every problem is listed (job, field, reason), not only the first: fields, each job's step
    tree, triggers, ids used twice.

    Exit codes: 0 valid, 1 not valid (each problem on stderr, or in the JSON), 2 bad options.
    """
    from aegis_orchestration.yamlio import JobProblem, check_jobs  # noqa: PLC0415

    text = path.read_text(encoding="utf-8")
    jobs: list[Job]
    problems: list[JobProblem]
    as_json = path.suffix.lower() == ".json"
    try:
        doc = json.loads(text) if as_json else _yaml(text)
    except ValueError as err:
        jobs, problems = [], [JobProblem(None, None, f"not {'JSON' if as_json else 'YAML'}: {err}")]
    else:
        jobs, problems = check_jobs(doc)
    code = EXIT_INVALID if problems else exitcodes.OK
    if json_output:
        typer.echo(
            json.dumps(
                {
                    "file": str(path),
                    "valid": not problems,
                    "jobs": [j.id for j in jobs],
                    "problems": [
                        {"job": p.job, "field": p.field, "reason": p.reason} for p in problems
                    ],
                }
            )
        )
        raise typer.Exit(code)
    for p in problems:
        typer.echo(f"  {p}", err=True)
    if problems:
        typer.echo(f"jobs validate: {path}: {len(problems)} problem(s)", err=True)
    else:
        typer.echo(f"jobs validate: {path}: {len(jobs)} job(s) valid")
    raise typer.Exit(code)


def _yaml(text: str) -> Any:
    import yaml  # noqa: PLC0415

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(str(err)) from None


def _flag(job_id: str, **changes: Any) -> None:
    written: list[Change] = []
    job = _run(lambda store: store.update(job_id, by=_operator(), **changes), written)
    typer.echo(
        f"{job.id}: " + ", ".join(f"{k}={v}" for k, v in changes.items()) + f" (v{job.version})"
    )
    announce([job_id], changes=written)


@app.command(epilog=EXIT_CODES)
def enable(job_id: str) -> None:
    """Let the job's trigger fire again."""
    _flag(job_id, is_enabled=True)


@app.command(epilog=EXIT_CODES)
def disable(job_id: str) -> None:
    """Stop the job's trigger (the operator's toggle; the job stays)."""
    _flag(job_id, is_enabled=False)


@app.command(epilog=EXIT_CODES)
def delete(job_id: str) -> None:
    """Soft-delete the job (is_active = false); `list --all` still shows it."""
    _flag(job_id, is_active=False)


@app.command(epilog=EXIT_CODES)
def export(
    out: Annotated[Path | None, typer.Option("--out", help="Write here instead of stdout.")] = None,
) -> None:
    """Every active job as YAML, to promote them to another environment with `import`."""
    from aegis_orchestration.yamlio import dump_jobs  # noqa: PLC0415

    jobs = [j for j in _run(lambda store: store.all()) if j.is_active]
    text = dump_jobs(jobs)
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)
        typer.echo(f"exported {len(jobs)} jobs to {out}")


@app.command(name="export-asl", epilog=EXIT_CODES)
def export_asl_command(
    job_id: str,
    function_arn: Annotated[
        str, typer.Option(help="The task function's Lambda ARN.")
    ] = DEFAULT_FUNCTION_ARN,
) -> None:
    """The job as an Amazon States Language definition (Step Functions)."""
    from aegis_orchestration.asl import AslExportError, export_asl  # noqa: PLC0415

    job = _run(lambda store: _get(store, job_id))
    try:
        typer.echo(json.dumps(export_asl(job, function_arn=function_arn), indent=2))
    except AslExportError as err:
        typer.echo(f"jobs: {job_id} cannot be exported: {err}", err=True)
        raise typer.Exit(EXIT_REFUSED) from None


@app.command(name="export-sfn", epilog=EXIT_CODES)
def export_sfn_command(
    job_ids: Annotated[
        list[str] | None,
        typer.Argument(
            help="The jobs (default: every registered job not deleted).", show_default=False
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Write here (YAML when it ends in .yaml or .yml) instead of stdout."
        ),
    ] = None,
) -> None:
    """The jobs as a CloudFormation template running them on Step Functions: one state machine
    per job, the task function they call, and the orchestrator's permission to start them."""
    from aegis_orchestrator.sfn_template import SfnTemplateError, render  # noqa: PLC0415

    async def work(store: JobStore) -> list[Job]:
        if job_ids:
            return [await _get(store, job_id) for job_id in dict.fromkeys(job_ids)]
        return [j for j in await store.all() if j.is_active]

    jobs = _run(work)
    try:
        template = render(jobs)
    except SfnTemplateError as err:
        for job_id, reason in err.problems:
            typer.echo(f"  {job_id}: {reason}", err=True)
        typer.echo("jobs: refused: these jobs cannot run on Step Functions", err=True)
        raise typer.Exit(EXIT_REFUSED) from None
    if out is not None and out.suffix.lower() in (".yaml", ".yml"):
        import yaml  # noqa: PLC0415

        text = yaml.safe_dump(template, sort_keys=False, width=100)
    else:
        text = json.dumps(template, indent=2) + "\n"
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text, encoding="utf-8")
        typer.echo(f"exported {len(jobs)} jobs as state machines to {out}")


@app.command(epilog=EXIT_CODES)
def runs(
    job_id: str,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 20,
    json_output: Annotated[bool, typer.Option("--json", help="Whole log items as JSON.")] = False,
) -> None:
    """The job's latest executions from the execution log (30 days): status, the steps' (the
    built-in engine's) and the error's name (--json: the whole items, the error's cause too)."""
    items = _run(lambda store: store.executions(job_id, limit=limit))
    if json_output:
        typer.echo(json.dumps(items, indent=2, default=str))
        return
    for item in items:
        steps = " ".join(f"{s['step_id']}:{s['status']}" for s in item.get("steps", []))
        error = (item.get("error") or {}).get("Error")
        ended = f" error={error}" if error else ""
        line = f"{item['started_at']} {item['execution_id']} {item['status']:<16} {steps}{ended}"
        typer.echo(line.rstrip())
