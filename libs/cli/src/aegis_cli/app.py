"""``aegis``: the one operator command. Subcommands for what operators do by hand.

Services add their subcommands (``simulate``, ``report``, ``jobs``, …) through the entry-point group
``aegis.commands`` (name -> a ``typer.Typer`` or a command function), so this library never imports
a service and an image with one service installed shows that service's commands.

Loading is lazy (:class:`PluginGroup`): a plugin's module is imported when its command is named, or
when the root help lists it; plugin modules keep their heavy imports (the AWS SDK, FastStream)
inside the command functions, so ``aegis --help`` and ``aegis <command> --help`` answer at once.
Results go to stdout and logs to stderr (:func:`configure_logging`), so ``aegis … --json | jq``
works for every command. Exit codes: :mod:`aegis_cli.exitcodes`.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import traceback
from enum import StrEnum
from functools import cache
from importlib.metadata import EntryPoint, distributions, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

from aegis_cli import exitcodes
from aegis_cli.exitcodes import FAILED as EXIT_FAILED
from aegis_cli.exitcodes import FOUND as EXIT_DRIFT

if TYPE_CHECKING:
    from aegis_runtime.settings import AegisSettings

# built-in commands kept in modules of their own, loaded like the plugins: name -> module:attr
_LAZY_BUILTINS = {"devices": "aegis_cli.devices_cli:app"}
PLUGIN_GROUP = "aegis.commands"
_HELP_ASKED = "aegis.help_asked"
# the click Context of typer's vendored click (typer.Context is a subclass): overrides take it
ClickContext = Any


@cache
def _plugin_entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP)}


def _as_command(name: str, target: object) -> Any:
    """The click command of an entry point's target: a ``typer.Typer`` or a command function."""
    if isinstance(target, typer.Typer):
        group = typer.main.get_group(target)
        group.name = name
        return group
    if not callable(target):
        raise TypeError(f"{target!r} is neither a typer.Typer nor a function")
    single = typer.Typer(pretty_exceptions_enable=False, add_completion=False)
    single.command(name=name)(target)
    return typer.main.get_command(single)


class PluginGroup(TyperGroup):
    """The root group: the commands defined here, plus one command per ``aegis.commands`` entry
    point (and :data:`_LAZY_BUILTINS`), each loaded only when asked for. A plugin that cannot be
    loaded is left out with a line on stderr, as before. A command that fails because NATS or
    S3/DynamoDB did not answer ends with one line naming the URL and exit code 5."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._loaded: dict[str, Any] = {}

    def lazy_names(self) -> list[str]:
        own = set(self.commands)
        names = [*_LAZY_BUILTINS, *sorted(_plugin_entry_points())]
        return [n for n in dict.fromkeys(names) if n not in own]

    def list_commands(self, ctx: ClickContext) -> list[str]:
        return [*super().list_commands(ctx), *self.lazy_names()]

    def get_command(self, ctx: ClickContext, cmd_name: str) -> Any:
        own = super().get_command(ctx, cmd_name)
        if own is not None or cmd_name not in self.lazy_names():
            return own
        if cmd_name not in self._loaded:
            self._loaded[cmd_name] = self._load(cmd_name)
        return self._loaded[cmd_name]

    @staticmethod
    def _load(name: str) -> Any:
        try:
            if name in _LAZY_BUILTINS:
                target = EntryPoint(name, _LAZY_BUILTINS[name], PLUGIN_GROUP).load()
            else:
                target = _plugin_entry_points()[name].load()
            return _as_command(name, target)
        except Exception as err:
            print(f"aegis: cannot load command {name!r}: {err}", file=sys.stderr)
            return None

    def resolve_command(self, ctx: ClickContext, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except typer.TyperException as err:  # "No such command": suggest among every name
            from difflib import get_close_matches  # noqa: PLC0415

            message = getattr(err, "message", "")
            if args and "Did you mean" not in message:
                matches = get_close_matches(args[0], self.list_commands(ctx))
                if matches and hasattr(err, "message"):
                    suggestions = ", ".join(repr(m) for m in matches)
                    err.message = f"{message.rstrip('.')}. Did you mean {suggestions}?"
            raise

    def invoke(self, ctx: ClickContext) -> Any:
        # the root callback runs before the subcommand parses its own --help: tell it (below)
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        ctx.meta[_HELP_ASKED] = any(arg in ctx.help_option_names for arg in rest)
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except Exception as err:
            # a server that did not answer, or storage that refused or failed, is said in one
            # line with its exit code whatever the command; anything else is a fault: raised
            where = " ".join(["aegis", *filter(None, [ctx.invoked_subcommand])])
            code = exitcodes.report_failure(where, err)
            if code is None:
                raise
            raise typer.Exit(code) from None


def command_names() -> list[str]:
    """Every ``aegis`` subcommand this installation has: built in, and the plugins' (by name,
    without loading them)."""
    group = typer.main.get_command(app)
    assert isinstance(group, PluginGroup)
    return [*group.commands, *group.lazy_names()]


app = typer.Typer(
    name="aegis",
    cls=PluginGroup,
    help="AEGIS factory-safety telemetry platform: operator commands.",
    epilog=exitcodes.ROOT_EPILOG,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_versions() -> list[tuple[str, str]]:
    """(distribution, version) of aegis-cli, then of every other installed AEGIS package."""
    found: dict[str, str] = {}
    for dist in distributions():
        name = _norm(dist.metadata["Name"] or "")
        if name.startswith("aegis-"):
            found[name] = dist.version
    return sorted(found.items(), key=lambda item: (item[0] != "aegis-cli", item[0]))


def _show_versions(value: bool) -> None:
    if value:
        for name, version in installed_versions():
            typer.echo(f"{name} {version}")
        raise typer.Exit()


def configure_logging() -> None:
    """Logs of every command go to stderr (stdout is the result), redacted like a service's
    (``aegis_runtime.logging``: secrets in values, URLs and exception texts), in
    ``AEGIS_LOG_FORMAT`` at ``AEGIS_LOG_LEVEL``."""
    from aegis_runtime.logging import configure  # noqa: PLC0415 - not for --help
    from aegis_runtime.redact import redact_text  # noqa: PLC0415
    from aegis_runtime.settings import AegisSettings  # noqa: PLC0415

    try:
        settings = AegisSettings()
    except ValueError as err:  # pydantic's ValidationError: a bad AEGIS_* variable
        typer.echo(f"aegis: invalid settings: {redact_text(str(err))}", err=True)
        raise typer.Exit(exitcodes.USAGE) from None
    configure(settings.log_format, settings.log_level, stderr=True)


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_show_versions,
            help="Print the versions of aegis-cli and of every installed AEGIS package.",
        ),
    ] = False,
) -> None:
    """AEGIS factory-safety telemetry platform: operator commands."""
    if not ctx.resilient_parsing and not ctx.meta.get(_HELP_ASKED):
        configure_logging()
        from aegis_runtime.envcheck import report_environment  # noqa: PLC0415 - not for --help

        report_environment()  # AEGIS_* variables no component reads, deprecated names: stderr


@app.command()
def bootstrap(
    check: Annotated[
        bool, typer.Option("--check", help="Only compare with the contract; change nothing.")
    ] = False,
    reindex: Annotated[
        bool,
        typer.Option(
            "--reindex",
            help="Ask the processor and the alert dispatcher to backfill the fleet index again "
            "(after a rollout during which writers of the previous version kept writing); each "
            "then scans the table's keys once, on its next check.",
        ),
    ] = False,
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print one JSON document: {"target", "steps", "changed", "drift", "exit_code"}.',
        ),
    ] = False,
) -> None:
    """Create the bucket and table of the storage contract, idempotently.

    A second run changes nothing and says so. With --check, report drift and change nothing.

    Exit codes: 0 done (--check: matches the contract), 1 failed, 3 drift found, 5 S3/DynamoDB
    not reachable.
    """
    from aegis_runtime.settings import AegisSettings  # noqa: PLC0415 - not for --help
    from aegis_storage.errors import StorageError  # noqa: PLC0415

    settings = AegisSettings()
    try:
        outcome = asyncio.run(_bootstrap(settings, check=check, reindex=reindex))
    except StorageError as err:
        raise typer.Exit(exitcodes.report(f"bootstrap failed: {err}", err)) from None
    if json_output:
        typer.echo(json.dumps(outcome))
    else:
        for line in outcome["steps"]:
            typer.echo(
                f"  {line['action']:<9} {line['resource']:<40} {line['setting']:<20} "
                f"{line['detail']}"
            )
        if not check:
            typer.echo(
                f"bootstrap: {'changes applied' if outcome['changed'] else 'nothing to change'} "
                f"({outcome['target']})"
            )
        for line in outcome["drift"]:
            typer.echo(f"  drift     {line}", err=True)
        if check:
            found = outcome["drift"]
            typer.echo("bootstrap --check: " + ("drift found" if found else "matches the contract"))
    raise typer.Exit(outcome["exit_code"])


async def _bootstrap(
    settings: AegisSettings, *, check: bool, reindex: bool = False
) -> dict[str, Any]:
    from aegis_storage.bootstrap import bootstrap as run_bootstrap  # noqa: PLC0415
    from aegis_storage.bootstrap import (  # noqa: PLC0415
        describe_foundation,
        drift,
        expected_foundation,
    )
    from aegis_storage.clients import open_clients  # noqa: PLC0415

    steps: list[dict[str, str]] = []
    changed = False
    async with open_clients(settings.aws()) as clients:
        if not check:
            report = await run_bootstrap(
                clients, bucket=settings.bucket, table=settings.table, reindex=reindex
            )
            changed = report.changed
            steps = [
                {
                    "action": step.action,
                    "resource": step.resource,
                    "setting": step.setting,
                    "detail": step.detail,
                }
                for step in report.steps
            ]
        actual = await describe_foundation(clients, bucket=settings.bucket, table=settings.table)
    found = drift(
        actual,
        expected_foundation(bucket=settings.bucket, table=settings.table, region=settings.region),
    )
    return {
        "target": settings.aws_endpoint_url or f"AWS {settings.region}",
        "check": check,
        "steps": steps,
        "changed": changed,
        "drift": list(found),
        "exit_code": EXIT_DRIFT if found else exitcodes.OK,
    }


class FailOn(StrEnum):
    """``aegis status --fail-on``: the lowest level that fails the command."""

    WARNING = "warning"
    CRITICAL = "critical"


@app.command()
def status(
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the rows as JSON (for scripts).")
    ] = False,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until Ctrl-C.")] = False,
    interval: Annotated[
        float, typer.Option(min=0.2, help="Seconds between refreshes with --watch.")
    ] = 2.0,
    fail_on: Annotated[
        FailOn | None,
        typer.Option(
            "--fail-on",
            case_sensitive=False,
            help="Exit 3 when any factory is at this level or above (for scripts; the output "
            "is the same).",
        ),
    ] = None,
) -> None:
    """The fleet from the read model: level, score, reasons, freshness, pipeline per factory.

    Exit codes: 0 read, 1 failed, 3 a factory at or above the --fail-on level, 5 S3/DynamoDB
    not reachable.
    """
    from aegis_cli.status import run_status  # noqa: PLC0415 - only this command needs it
    from aegis_runtime.settings import AegisSettings  # noqa: PLC0415

    if fail_on is not None and watch:
        raise typer.BadParameter(
            "--fail-on is for one reading, not --watch", param_hint="--fail-on"
        )
    raise typer.Exit(
        run_status(
            AegisSettings(),
            json_output=json_output,
            watch=watch,
            interval=interval,
            fail_on=None if fail_on is None else fail_on.value.upper(),
        )
    )


@app.command()
def streams(
    json_output: Annotated[
        bool,
        typer.Option("--json", help='Print {"streams": {name: outcome}} as JSON (for scripts).'),
    ] = False,
) -> None:
    """Create or update the NATS JetStream streams to the contract, once per deployment.

    Run it as the admin identity (AEGIS_NATS_USER=admin): services with identities run with
    AEGIS_NATS_MANAGE_STREAMS=false and only check that the streams exist.

    Exit codes: 0 done, 1 failed, 5 NATS not reachable within AEGIS_NATS_CONNECT_TIMEOUT_S.
    """
    from aegis_runtime.bus import (  # noqa: PLC0415 - only this command needs a broker
        BrokerError,
        StreamLimits,
        connect_broker,
        create_broker,
        ensure_streams,
    )
    from aegis_runtime.settings import AegisSettings  # noqa: PLC0415

    settings = AegisSettings()

    async def run() -> dict[str, str]:
        broker = create_broker(settings, name="streams")
        try:
            await connect_broker(broker, settings)
            return dict(await ensure_streams(broker, limits=StreamLimits.of(settings)))
        finally:
            await broker.stop()

    try:
        outcome = asyncio.run(run())
    except BrokerError as err:
        raise typer.Exit(exitcodes.report(f"streams failed: {err}", err)) from None
    if json_output:
        typer.echo(json.dumps({"streams": outcome}))
        return
    for name, what in outcome.items():
        typer.echo(f"  {what:<9} {name}")


@app.command(name="nats-auth")
def nats_auth(
    passwords: Annotated[
        Path,
        typer.Argument(
            dir_okay=False,
            help="name=password lines, one per NATS identity; created, and completed, as needed.",
        ),
    ],
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the block here instead of stdout.")
    ] = None,
    cost: Annotated[
        int | None,
        typer.Option(
            min=4,
            max=31,
            help="bcrypt's cost (each step doubles it). Default 11, as `nats server passwd`; the "
            "server pays it again at every connection's check.",
        ),
    ] = None,
) -> None:
    """Write nats-server's authorization block: every NATS identity with its permissions
    (aegis_contracts.bus) and bcrypt hashes of the passwords file's passwords.

    Identities missing from the passwords file get a new random password there first (mode
    0600). Mount the file as the services' secret and the block as the server's.
    """
    from aegis_cli.natsauth import (  # noqa: PLC0415 - only this command needs bcrypt
        ensure_passwords,
        server_authorization,
    )

    try:
        chosen = {} if cost is None else {"cost": cost}
        block = server_authorization(ensure_passwords(passwords), **chosen)
    except ValueError as err:
        typer.echo(f"nats-auth: {err}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    if out is None:
        typer.echo(block, nl=False)
    else:
        out.write_text(block)
        typer.echo(f"nats-auth: wrote {out}", err=True)


def main() -> NoReturn:
    """Run the command, then end the process with its exit code without finalizing the
    interpreter (:func:`aegis_runtime.process.exit_process`: the S3 client's threads could
    otherwise crash a command that succeeded)."""
    from aegis_runtime.process import exit_process  # noqa: PLC0415

    code: object = 0
    try:
        app()
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        traceback.print_exc()
        code = 1
    exit_process(code)


if __name__ == "__main__":
    main()
