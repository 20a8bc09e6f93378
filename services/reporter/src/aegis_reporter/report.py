"""The daily report of one KST day: hourly folds, then the day's artifacts.

For each target (every factory of the fleet with processed/ data that day, and ``cloud-infra``) and each of
the 24 UTC hour partitions of the KST day: list the hour's objects, and unless the stored
``intermediate/hourly/hh=HH.json`` was made from exactly that listing (count and digest of keys
and ETags, same fold parameters), read them (at most ``concurrency`` at once), fold them, and
write the intermediate at once. A run killed halfway therefore resumes at the first hour it had
not written, and late data changes the listing of its hour, which is then folded again. Memory
holds one hour's records at a time and the 24 folds, never the day's objects.

The day's alert incidents of the target (:mod:`aegis_reporter.incidents`: closed records from
``incidents/``, open ones from the read model) join the summary as ``alert_incidents``; a
target with neither data nor incidents that day gets no report. After every target,
``fleet-incidents-summary.json`` beside the targets' folders has the fleet's totals.

Then factory-daily-summary.json / cloud-infra-daily-summary.json, report-context.json,
report.md (from the context only, by the configured generator) and generation-metadata.json;
an ObjectCreated for report.md and a ``report_generated`` system event. Every artifact but the
``timings`` of the metadata is the same byte for byte when a day is run again.

The schedule: each day is claimed once across replicas (``CLAIM#report-daily``, window = the
KST day's start), run at ``run_at`` after KST midnight for the previous day; days of the last
``catchup_days`` without a finished claim are caught up, oldest first.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol

import pydantic
import structlog

from aegis_contracts import keys, msgids
from aegis_contracts.cloud import CloudSnapshot
from aegis_contracts.events import ObjectCreated, SystemEvent
from aegis_contracts.items import Incident
from aegis_contracts.keys import CLOUD_INFRA_TARGET, CloudTier, ReportArtifact
from aegis_contracts.subjects import object_created_subject, system_subject
from aegis_contracts.times import Clock, format_ts, kst_day_bounds, kst_report_date, truncate_ms
from aegis_contracts.ttl import expires_at
from aegis_folds.folds import (
    CloudHour,
    FactoryHour,
    FoldParams,
    Hour,
    InputListing,
    fold_cloud_hour,
    hour_from_windows,
    listing_of,
)
from aegis_folds.sketch import DEFAULT_ALPHA
from aegis_folds.windows import current_windows, hour_entries
from aegis_reporter.day import DayWindow, cloud_summary, factory_summary, report_context
from aegis_reporter.generators import ReportGenerator, TemplateGenerator
from aegis_reporter.incidents import day_incidents, fleet_summary, section, with_section
from aegis_reporter.summary import AlertSection, CloudSummary, FactorySummary
from aegis_runtime.heartbeat import instance_id
from aegis_storage.errors import NotFound
from aegis_storage.incidents import IncidentStore
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectInfo, ObjectStore
from aegis_storage.tasks import all_of

log = structlog.get_logger(__name__)

JOB = "report-daily"
PRODUCER = "reporter"
CLAIM_TTL_S = 90 * 86_400
OBJECT_FAMILY = "reports"
EVENT_KIND = "report_generated"
MODELS: dict[str, type[pydantic.BaseModel]] = {
    CloudTier.FAST.value: CloudSnapshot,
    CloudTier.SLOW.value: CloudSnapshot,
}
VERSIONED = ("aegis-reporter", "aegis-contracts", "aegis-storage", "aegis-runtime", "pydantic")


class Publish(Protocol):
    def __call__(
        self, subject: str, event: ObjectCreated | SystemEvent, *, msg_id: str
    ) -> Awaitable[bool]: ...


def artifact_bytes(value: Any) -> bytes:
    """Stable JSON: sorted keys, two-space indent, floats as Python's shortest repr."""
    return (json.dumps(value, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()


def package_versions() -> dict[str, str]:
    found = {}
    for name in VERSIONED:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "unknown"
    return found


@dataclass(slots=True)
class TargetRun:
    """What one run did for one target of one day."""

    target: str
    day: date
    objects: int = 0
    objects_read: int = 0
    windows_read: int = 0
    hours_read: list[int] = field(default_factory=list)
    hours_reused: list[int] = field(default_factory=list)
    report_key: str | None = None
    worst_level: str | None = None
    incidents: int = 0
    alert_incidents: int = 0
    generator: str = ""
    # the summary's alert_incidents, for the fleet's totals
    alerts: AlertSection | None = field(default=None, repr=False)


class Reporter:
    def __init__(
        self,
        *,
        store: ObjectStore,
        readmodel: ReadModel,
        publish: Publish,
        clock: Clock,
        generator: ReportGenerator | None = None,
        concurrency: int = 32,
        gap_s: float = 60.0,
        offline_s: float = 300.0,
        cadence_s: float | None = None,
        alpha: float = DEFAULT_ALPHA,
        run_at: timedelta = timedelta(minutes=30),
        catchup_days: int = 7,
        lease: timedelta = timedelta(minutes=30),
        owner: str | None = None,
    ) -> None:
        self.store = store
        self.readmodel = readmodel
        self.incidents = IncidentStore(readmodel, store)
        self.publish = publish
        self.clock = clock
        self.generator = generator or TemplateGenerator()
        self.params = FoldParams(gap_s=gap_s, alpha=alpha)
        self.offline_s = offline_s
        self.cadence_s = cadence_s
        self.run_at = run_at
        self.catchup_days = catchup_days
        self.lease = lease
        self.owner = owner or instance_id()
        self._slots = asyncio.Semaphore(concurrency)

    # -- schedule ---------------------------------------------------------------------------

    def due_days(self, now: datetime) -> list[date]:
        """The days of the catch-up horizon whose report is due, oldest first."""
        newest = kst_report_date(now - self.run_at) - timedelta(days=1)
        return [newest - timedelta(days=i) for i in range(self.catchup_days - 1, -1, -1)]

    def next_due(self, now: datetime) -> datetime:
        """When the next day becomes due."""
        newest = kst_report_date(now - self.run_at)
        return kst_day_bounds(newest)[1] + self.run_at

    async def tick(self, stop: asyncio.Event | None = None) -> list[date]:
        """Run every due day that no replica has finished and this one can claim; once ``stop``
        is set, none after the day being written (a stopping replica leaves the rest of a
        catch-up to the next one, unclaimed)."""
        now = truncate_ms(self.clock())
        due = self.due_days(now)
        claims = await self.readmodel.window_claims(
            JOB, kst_day_bounds(due[0])[0], kst_day_bounds(due[-1])[1], now=now
        )
        ran: list[date] = []
        for day in due:
            if stop is not None and stop.is_set():
                log.info("catchup_left_to_next_start", left=len(due) - due.index(day))
                break
            start = kst_day_bounds(day)[0]
            won = await self.readmodel.claim_pending(
                JOB,
                start,
                claims=claims,
                owner=self.owner,
                now=now,
                ttl=expires_at(now, CLAIM_TTL_S),
                lease=self.lease,
            )
            if not won:
                continue
            runs = await self.run_day(day)
            await self.readmodel.finish_window(
                JOB, start, owner=self.owner, now=truncate_ms(self.clock())
            )
            ran.append(day)
            log.info("day_reported", report_date=day.isoformat(), targets=len(runs))
        return ran

    # -- one day ----------------------------------------------------------------------------

    async def targets(self) -> list[str]:
        """Every factory of the fleet (the read model's fleet index: no listing of processed/,
        which grows with every factory-day), then ``cloud-infra``. A factory without data that
        day gets no report; one that left the fleet can still be reported with ``--target``."""
        return [*await self.readmodel.fleet_ids(), CLOUD_INFRA_TARGET]

    async def run_day(self, day: date, targets: list[str] | None = None) -> list[TargetRun]:
        """Report ``day`` for ``targets`` (default: all); a target without data that day gets
        no report. Today's date gives a report of the day so far."""
        live = await self.live_incidents()
        everyone = targets is None
        runs, sections = [], {}
        for target in targets or await self.targets():
            run = await self.run_target(day, keys.report_target(target), live=live)
            sections[run.target] = run.alerts
            if run.report_key is not None:
                runs.append(run)
        if everyone:
            await self.write_fleet(day, sections)
        return runs

    async def live_incidents(self) -> list[Incident]:
        """The incidents of the read model now: open, or resolved without a record yet."""
        return await self.incidents.listed(now=truncate_ms(self.clock()))

    async def write_fleet(self, day: date, sections: Mapping[str, AlertSection | None]) -> str:
        """``fleet-incidents-summary.json`` from the targets' ``alert_incidents``."""
        window = DayWindow.of(day, truncate_ms(self.clock()))
        key = keys.report_fleet_key(day)
        body = fleet_summary(window, {t: s for t, s in sections.items() if s is not None})
        await self.store.put_bytes(key, artifact_bytes(body.facts()))
        log.info("fleet_incidents_written", report_date=day.isoformat(), key=key)
        return key

    async def run_target(
        self, day: date, target: str, *, live: list[Incident] | None = None
    ) -> TargetRun:
        """Report one target; ``live``: the read model's incidents (read now when not given)."""
        started_at = truncate_ms(self.clock())
        t0 = time.perf_counter()
        window = DayWindow.of(day, started_at)
        run = TargetRun(target=target, day=day)
        hours: dict[int, Hour] = {}
        listed: list[dict[str, Any]] = []
        per_dataset: Counter[str] = Counter()
        for h in range(24):
            if not window.hour_started(h):
                continue
            entries = await self._list_hour(target, window.utc_hour(h))
            if not entries:
                continue
            listing = listing_of((ds, o.key, o.etag) for ds, o in entries)
            key = keys.report_hourly_key(day, target, h)
            fold = await self._stored_fold(key, target, listing)
            if fold is None:
                fold = await self._fold(target, window, h, entries, listing, run=run)
                body = artifact_bytes(fold.model_dump(mode="json"))
                await self.store.put_bytes(key, body)
                fold = _parse_fold(target, body)  # exactly what a resumed run would read back
                run.hours_read.append(h)
            else:
                run.hours_reused.append(h)
            hours[h] = fold
            per_dataset.update(listing.per_dataset)
            listed.append(
                {"kst_hour": h, "objects": listing.count, "digest": listing.digest, "key": key}
            )
        run.objects = sum(per_dataset.values())
        run.alerts = alerts = await self._alerts(target, window, live)
        if not hours and not alerts.items:
            log.info("report_skipped_no_data", report_date=day.isoformat(), target=target)
            return run
        t_folded = time.perf_counter()

        typed, summary_artifact = self._summary(target, window, hours)
        summary = with_section(typed, alerts).facts()
        context = report_context(summary)
        generated = await self.generator.generate(context)
        t_generated = time.perf_counter()

        await self.store.put_bytes(
            keys.report_key(day, target, summary_artifact), artifact_bytes(summary)
        )
        await self.store.put_bytes(
            keys.report_key(day, target, ReportArtifact.CONTEXT), artifact_bytes(context)
        )
        report_key = keys.report_key(day, target, ReportArtifact.REPORT)
        put = await self.store.put_bytes(
            report_key, generated.markdown.encode(), content_type="text/markdown; charset=utf-8"
        )
        metadata = {
            "report_date": day.isoformat(),
            "target": target,
            "generator": generated.info,
            "reporter": {"name": PRODUCER, "version": package_versions()["aegis-reporter"]},
            "package_versions": package_versions(),
            "parameters": {
                **self.params.model_dump(),
                "offline_s": self.offline_s,
                "cadence_s": self.cadence_s,
            },
            "inputs": {
                "objects": run.objects,
                "per_dataset": dict(sorted(per_dataset.items())),
                "hours": listed,
                "missing_hours": [
                    h for h in range(24) if window.hour_started(h) and h not in hours
                ],
                "hours_not_begun": [h for h in range(24) if not window.hour_started(h)],
            },
            "artifacts": [
                keys.report_key(day, target, a)
                for a in (summary_artifact, ReportArtifact.CONTEXT, ReportArtifact.REPORT)
            ],
            # the one part that differs from run to run
            "timings": {
                "started_at": format_ts(started_at),
                "finished_at": format_ts(truncate_ms(self.clock())),
                "read_and_fold_s": round(t_folded - t0, 3),
                "generate_s": round(t_generated - t_folded, 3),
                "total_s": round(time.perf_counter() - t0, 3),
                "hours_read": run.hours_read,
                "hours_reused": run.hours_reused,
                "objects_read": run.objects_read,
                "windows_read": run.windows_read,
            },
        }
        await self.store.put_bytes(
            keys.report_key(day, target, ReportArtifact.METADATA), artifact_bytes(metadata)
        )
        await self._announce(report_key, put.etag, put.size_bytes, summary, generated.info)
        run.report_key = report_key
        run.worst_level = summary["headline"]["worst_level"]
        run.incidents = summary["headline"]["incidents"]
        run.alert_incidents = summary["headline"]["alert_incidents"]
        run.generator = str(generated.info.get("name", ""))
        log.info(
            "report_written",
            report_date=day.isoformat(),
            target=target,
            objects=run.objects,
            objects_read=run.objects_read,
            hours_reused=len(run.hours_reused),
            worst_level=run.worst_level,
            incidents=run.incidents,
            alert_incidents=run.alert_incidents,
            generator=run.generator,
        )
        return run

    async def _alerts(
        self, target: str, window: DayWindow, live: list[Incident] | None
    ) -> AlertSection:
        """The summary's ``alert_incidents`` of ``target`` that day."""
        found, unreadable = await day_incidents(
            self.incidents,
            target,
            window,
            await self.live_incidents() if live is None else live,
        )
        return section(found, unreadable)

    def _summary(
        self, target: str, window: DayWindow, hours: dict[int, Hour]
    ) -> tuple[FactorySummary | CloudSummary, ReportArtifact]:
        if target == CLOUD_INFRA_TARGET:
            cloud = {h: f for h, f in hours.items() if isinstance(f, CloudHour)}
            return cloud_summary(target, window, cloud), ReportArtifact.CLOUD_SUMMARY
        factory = {h: f for h, f in hours.items() if isinstance(f, FactoryHour)}
        summary = factory_summary(
            target,
            window,
            factory,
            self.params,
            offline_s=self.offline_s,
            cadence_s=self.cadence_s,
        )
        return summary, ReportArtifact.FACTORY_SUMMARY

    async def _announce(
        self,
        key: str,
        etag: str | None,
        size: int,
        summary: dict[str, Any],
        generator: dict[str, Any],
    ) -> None:
        now = truncate_ms(self.clock())
        await self.publish(
            object_created_subject(OBJECT_FAMILY),
            ObjectCreated(
                bucket=self.store.bucket,
                key=key,
                size_bytes=size,
                etag=etag,
                producer=PRODUCER,
                created_at=now,
            ),
            msg_id=msgids.object_created(key, etag),
        )
        await self.publish(
            system_subject(EVENT_KIND),
            SystemEvent(
                kind=EVENT_KIND,
                producer=PRODUCER,
                at=now,
                detail={
                    "report_date": summary["report_date"],
                    "target": summary["target"],
                    "bucket": self.store.bucket,
                    "key": key,
                    "complete_day": summary["complete_day"],
                    "worst_level": summary["headline"]["worst_level"],
                    "incidents": summary["headline"]["incidents"],
                    "generator": generator.get("name"),
                },
            ),
            msg_id=f"{EVENT_KIND}:{key}:{etag}",
        )

    # -- one hour ---------------------------------------------------------------------------

    async def _list_hour(self, target: str, utc_hour: datetime) -> list[tuple[str, ObjectInfo]]:
        if target != CLOUD_INFRA_TARGET:
            return await hour_entries(self.store, target, utc_hour)
        prefixes = [(t.value, keys.cloud_infra_hour_prefix(t, utc_hour)) for t in CloudTier]
        entries: list[tuple[str, ObjectInfo]] = []
        for dataset, prefix in prefixes:
            entries.extend([(dataset, o) async for o in self.store.list_objects(prefix)])
        return entries

    async def _stored_fold(self, key: str, target: str, listing: InputListing) -> Hour | None:
        """The stored fold of this hour when it was made from this very listing."""
        try:
            body = await self.store.get_bytes(key)
        except NotFound:
            return None
        try:
            fold = _parse_fold(target, body)
        except (pydantic.ValidationError, ValueError):
            return None  # damaged or of an older shape: fold again
        if fold.input != listing or fold.params != self.params:
            return None
        return fold

    async def _read(self, dataset: str, key: str) -> tuple[str, pydantic.BaseModel | None]:
        async with self._slots:
            body = await self.store.get_bytes(key)
        try:
            return dataset, MODELS[dataset].model_validate_json(body)
        except pydantic.ValidationError:
            log.warning("object_skipped", key=key, reason="does not parse")
            return dataset, None

    async def _fold(
        self,
        target: str,
        window: DayWindow,
        kst_hour: int,
        entries: list[tuple[str, ObjectInfo]],
        listing: InputListing,
        *,
        run: TargetRun,
    ) -> Hour:
        utc_hour = window.utc_hour(kst_hour)
        if target == CLOUD_INFRA_TARGET:
            read = await all_of(*(self._read(ds, o.key) for ds, o in entries))
            run.objects_read += len(read)
            return fold_cloud_hour(
                target=target,
                report_date=window.day,
                kst_hour=kst_hour,
                utc_hour=utc_hour,
                params=self.params,
                listing=listing,
                snapshots=[r for _, r in read if isinstance(r, CloudSnapshot)],
                skipped=sum(1 for _, r in read if r is None),
            )
        # a factory's hour: merged from the aggregator's window folds, reading objects only
        # where the windows are missing or behind the listing
        windows = await current_windows(
            self.store, target, utc_hour, entries, self.params, concurrency=self._slots
        )
        run.objects_read += windows.objects_read
        run.windows_read += windows.windows_read
        return hour_from_windows(
            windows.folds.values(),
            target=target,
            report_date=window.day,
            kst_hour=kst_hour,
            utc_hour=utc_hour,
            params=self.params,
            listing=listing,
        )


def _parse_fold(target: str, body: bytes) -> Hour:
    if target == CLOUD_INFRA_TARGET:
        return CloudHour.model_validate_json(body)
    return FactoryHour.model_validate_json(body)
