"""``aegis alerts resend``: deliver the alerts that Slack could not take when they fired.

Dead-lettered alerts wait on ``aegis.dlq.alert-dispatcher.undeliverable`` (stream AEGIS_DLQ). This
command reads them through its own durable consumer (``alerts-resend``), so each is resent once:
a delivered one is acknowledged, one that still fails stays for the next run. An alert whose
ALERT# items all show a later delivery (newer snapshots fired them meanwhile) is skipped as
superseded.

It first asks the consumer how many letters wait (not yet read, or read and not yet settled) and
reads until it has seen that many, ``--wait`` seconds at most: a slow server or a letter another
run still holds is reported as unread, never taken for "nothing to resend".
Exit codes: 0 every alert delivered or skipped, 1 some still undeliverable or left unread, 2 no
webhook set, 5 NATS or S3/DynamoDB not reachable (:mod:`aegis_cli.exitcodes`).

Import-light: ``aegis --help`` imports this module, so the SDKs are imported in the command.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import typer

from aegis_cli import exitcodes
from aegis_contracts.bus import consumer

if TYPE_CHECKING:
    from aegis_alert_dispatcher.settings import DispatcherSettings
    from aegis_alert_dispatcher.slack import SlackWebhook
    from aegis_runtime.natsio import Msg
    from aegis_storage.readmodel import ReadModel

app = typer.Typer(help="Slack alerts: resend the dead-lettered ones.", no_args_is_help=True)

RESEND = consumer("alerts-resend")
EXIT_UNDELIVERED = exitcodes.FAILED
EXIT_NO_WEBHOOK = 2


@dataclass
class Summary:
    delivered: int = 0
    superseded: int = 0
    failed: int = 0
    unreadable: int = 0
    unread: int = 0
    listed: list[dict[str, Any]] = field(default_factory=list)


@app.command()
def resend(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be resent; send and consume nothing.")
    ] = False,
    limit: Annotated[int, typer.Option(min=1, help="At most this many alerts.")] = 1000,
    attempts: Annotated[int, typer.Option(min=1, max=20, help="Attempts per alert.")] = 3,
    wait: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Seconds to wait for letters the consumer counts as waiting but does not hand "
            "out yet (a slow server, or letters another run holds); those still unread then are "
            "reported and exit 1.",
        ),
    ] = 30.0,
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print one JSON document: {"delivered", "superseded", "failed", "unreadable", '
            '"unread", "listed": [...], "dry_run"}.',
        ),
    ] = False,
) -> None:
    """Resend dead-lettered Slack alerts (after the webhook is back).

    Exit codes: 0 every alert delivered or skipped, 1 some still undeliverable or left unread,
    2 no webhook set (or bad options), 5 NATS (within AEGIS_NATS_CONNECT_TIMEOUT_S) or
    S3/DynamoDB not reachable.
    """
    from aegis_alert_dispatcher.settings import DispatcherSettings  # noqa: PLC0415

    settings = DispatcherSettings()
    if settings.slack_webhook_url is None and not dry_run:
        typer.echo("alerts resend: AEGIS_SLACK_WEBHOOK_URL is not set", err=True)
        raise typer.Exit(EXIT_NO_WEBHOOK)
    summary = asyncio.run(
        _resend(settings, dry_run=dry_run, limit=limit, attempts=attempts, wait=wait)
    )
    code = EXIT_UNDELIVERED if summary.failed or summary.unread else exitcodes.OK
    if json_output:
        typer.echo(json.dumps(asdict(summary) | {"dry_run": dry_run}))
        raise typer.Exit(code)
    for item in summary.listed:
        typer.echo(
            f"{item['outcome']:<11} {item['snapshot_at']}  {item['scope']:<20} "
            f"{item['severity']:<8} {item['reason']}  {item.get('detail', '')}"
        )
    typer.echo(
        f"alerts resend: delivered={summary.delivered} superseded={summary.superseded} "
        f"failed={summary.failed} unreadable={summary.unreadable} unread={summary.unread}"
        + (" (dry run)" if dry_run else "")
    )
    if summary.unread:
        typer.echo(
            f"alerts resend: {summary.unread} waiting letter(s) were not handed out within "
            f"{wait:g} s (another run may hold them); run it again",
            err=True,
        )
    raise typer.Exit(code)


FETCH_TIMEOUT_S = 2.0


async def _resend(
    s: DispatcherSettings, *, dry_run: bool, limit: int, attempts: int, wait: float
) -> Summary:
    import aiohttp  # noqa: PLC0415 - import-light module

    from aegis_alert_dispatcher.dispatcher import SERVICE, UNDELIVERABLE  # noqa: PLC0415
    from aegis_alert_dispatcher.slack import SlackWebhook  # noqa: PLC0415
    from aegis_contracts.subjects import dead_letter_subject  # noqa: PLC0415
    from aegis_runtime import natsio  # noqa: PLC0415
    from aegis_runtime.bus import command_broker  # noqa: PLC0415
    from aegis_runtime.redact import redact_url  # noqa: PLC0415
    from aegis_storage.clients import open_clients  # noqa: PLC0415
    from aegis_storage.readmodel import ReadModel  # noqa: PLC0415

    summary = Summary()
    broker = await command_broker(s, name="alerts-resend")
    held: list[Msg] = []
    try:
        try:
            sub = await natsio.pull_durable(
                broker,
                dead_letter_subject(SERVICE, UNDELIVERABLE),
                durable=RESEND.name,
                stream=RESEND.stream,
                ack_wait=120,
                max_deliver=-1,
            )
        except natsio.NotFound:
            typer.echo(
                f"alerts resend: the NATS at {redact_url(s.nats_url)} has no stream "
                f"{RESEND.stream}, so no dead letter to read: is it AEGIS's? (`aegis streams` "
                "makes the streams)",
                err=True,
            )
            raise typer.Exit(exitcodes.FAILED) from None
        async with aiohttp.ClientSession() as session, open_clients(s.aws()) as clients:
            readmodel = ReadModel(clients.items, s.table)
            url = s.slack_webhook_url.get_secret_value() if s.slack_webhook_url else ""
            webhook = SlackWebhook(url, session, max_attempts=attempts, timeout=s.slack_timeout_s)
            info = await sub.consumer_info()
            # not yet read, and read by an earlier or another run but not yet settled
            target = min(limit, (info.num_pending or 0) + (info.num_ack_pending or 0))
            until = time.monotonic() + wait
            seen = 0
            while seen < target:
                left = until - time.monotonic()
                try:
                    batch = await sub.fetch(
                        batch=min(50, target - seen), timeout=max(0.1, min(FETCH_TIMEOUT_S, left))
                    )
                except TimeoutError:  # nats-py's timeouts are TimeoutErrors too
                    if time.monotonic() < until:
                        continue
                    summary.unread = target - seen
                    break
                for msg in batch:
                    seen += 1
                    if dry_run:
                        held.append(msg)
                    keep = await _one(msg, webhook, readmodel, summary, dry_run=dry_run)
                    if keep and not dry_run:
                        held.append(msg)
                if summary.failed:
                    break  # the webhook is still down: leave the rest for the next run
    finally:
        for msg in held:
            await msg.nak()
        # close, not drain: draining a pull subscription waits out its timeout (30 s)
        await natsio.close(broker)
    return summary


async def _incident_delivered_since(readmodel: ReadModel, incident_id: str, sent: object) -> object:
    """The later of ``sent`` and the incident's last delivered notification."""
    from aegis_contracts import keys  # noqa: PLC0415

    item = await readmodel.get_item(keys.incident_pk(incident_id), keys.INCIDENT_SK)
    notified = item.get("last_notified_at") if item else None
    if notified and (not sent or str(notified) > str(sent)):
        return notified
    return sent


async def _one(
    msg: Msg, webhook: SlackWebhook, readmodel: ReadModel, summary: Summary, *, dry_run: bool
) -> bool:
    """Handle one dead letter; True when it must stay (not acknowledged)."""
    from aegis_alert_dispatcher.slack import Undeliverable  # noqa: PLC0415
    from aegis_contracts import keys  # noqa: PLC0415
    from aegis_contracts.times import format_ts  # noqa: PLC0415
    from aegis_runtime.bus import DeadLetter  # noqa: PLC0415

    try:
        letter = DeadLetter.model_validate_json(msg.data)
        record = json.loads(letter.payload_bytes())
        payload = record["slack_payload"]
    except (ValueError, KeyError) as err:
        summary.unreadable += 1
        summary.listed.append(
            {
                "outcome": "unreadable",
                "snapshot_at": "-",
                "scope": "-",
                "severity": "-",
                "reason": "-",
                "detail": str(err)[:80],
            }
        )
        return True
    row = {k: record.get(k, "-") for k in ("snapshot_at", "scope", "severity", "reason")}
    if dry_run:
        summary.listed.append(row | {"outcome": "pending"})
        return True
    # one message may speak for several alerts: superseded when every one was sent again since
    sent_since = []
    for sk in record.get("alert_sks") or [record["alert_sk"]]:
        state = await readmodel.get_item(keys.alert_pk(record["scope"]), sk)
        sent = state.get("last_sent_at") if state else None
        if state and state.get("incident_id"):  # its incident's sweep may have delivered it
            sent = await _incident_delivered_since(readmodel, str(state["incident_id"]), sent)
        sent_since.append(str(sent) if sent and str(sent) > format_ts(letter.received_at) else "")
    if all(sent_since):
        summary.superseded += 1
        summary.listed.append(
            row | {"outcome": "superseded", "detail": f"delivered at {max(sent_since)}"}
        )
        await msg.ack()
        return False
    try:
        await webhook.send(payload)
    except Undeliverable as err:
        summary.failed += 1
        summary.listed.append(row | {"outcome": "failed", "detail": err.detail[:80]})
        return True
    summary.delivered += 1
    summary.listed.append(row | {"outcome": "delivered"})
    await msg.ack()
    return False
