"""The read-only routes: views of the read model (DynamoDB) and of images and reports (S3).

Absent data is an empty result; an unknown or invalid factory id is a 404 with a clear body."""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from datetime import date, datetime
from typing import Annotated, Any, Literal

import structlog
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response
from markdown_it import MarkdownIt
from pydantic import BeforeValidator

from aegis_contracts import keys
from aegis_contracts.errors import ContractError
from aegis_contracts.people import Act, decide, factory_of
from aegis_contracts.times import Clock, format_ts, parse_ts
from aegis_dashboard_api import audit
from aegis_dashboard_api.authz import Permission, identity_of
from aegis_dashboard_api.errors import ApiError
from aegis_dashboard_api.live import alert_scope
from aegis_dashboard_api.models import (
    Alerts,
    AuditDay,
    Cloud,
    DayImages,
    Factory,
    Fleet,
    FleetEntry,
    History,
    ImageLink,
    Item,
    LatestImage,
    Problem,
    ReportEntry,
    Reports,
    Window,
)
from aegis_dashboard_api.selects import announce_select
from aegis_dashboard_api.settings import DashboardSettings
from aegis_storage.audit import AuditLog
from aegis_storage.clients import AwsClients
from aegis_storage.errors import NotFound
from aegis_storage.incidents import IncidentStore
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

log = structlog.get_logger(__name__)


class Reader:
    """What the routes read through: the read model, the bucket, presigning and the clock."""

    def __init__(self, clients: AwsClients, settings: DashboardSettings, clock: Clock) -> None:
        self.clients, self.settings, self.clock = clients, settings, clock
        self.readmodel = ReadModel(self.clients.items, self.settings.table)
        self.store = ObjectStore(self.clients, self.settings.bucket)
        self.incidents = IncidentStore(self.readmodel, self.store)
        # the fleet is one listing (the fleet index, then the LATEST items) shared by every open
        # screen, at most once per dashboard_fleet_cache_s
        self._fleet: list[Item] | None = None
        self._fleet_read_at = 0.0
        self._fleet_lock = asyncio.Lock()
        self._kept_warm = False  # a background task re-reads the fleet: requests never wait
        self._asked_at = -math.inf  # when a request last wanted the fleet (monotonic)

    async def fleet_items(self) -> list[Item]:
        """Every FACTORY LATEST. Kept warm (:meth:`keep_fleet_warm`), the cached fleet is always
        served, the listing running beside the requests; otherwise read again when older than the
        cache period (one read at a time: the first request without a fleet waits for it; once
        there is one, a request during a listing gets it, kept current by :meth:`note_latest`)."""
        self._asked_at = time.monotonic()
        fleet = self._fleet
        if fleet is not None and (
            self._kept_warm
            or self._fleet_lock.locked()  # a listing is under way (warming resumes with one)
            or time.monotonic() - self._fleet_read_at < self.settings.dashboard_fleet_cache_s
        ):
            return fleet
        return await self._read_fleet(force=False)

    async def _read_fleet(self, *, force: bool) -> list[Item]:
        async with self._fleet_lock:
            ttl = self.settings.dashboard_fleet_cache_s
            if force or self._fleet is None or time.monotonic() - self._fleet_read_at >= ttl:
                started = time.monotonic()
                listed = await self.readmodel.factory_latest_items()
                self._fleet = _newer_of(listed, self._fleet or [], add=False)
                self._fleet_read_at = started
            return self._fleet

    def note_latest(self, image: Item) -> None:
        """A LATEST heard on the queue replaces its factory's item in the cached fleet, so a page
        loaded right after an event never shows the state before it."""
        fleet = self._fleet
        if fleet is not None:
            self._fleet = _newer_of(fleet, [image], add=True)

    async def keep_fleet_warm(self, stop: asyncio.Event) -> None:
        """Re-read the fleet every cache period while screens use it, so a request never waits
        for the listing. With no request for ``dashboard_fleet_idle_s`` it reads nothing (a
        dashboard nobody looks at costs no reads); the next request reads the fleet itself,
        once, and warming resumes."""
        period = max(self.settings.dashboard_fleet_cache_s, 0.2)
        idle_after = self.settings.dashboard_fleet_idle_s
        while not stop.is_set():
            try:
                if time.monotonic() - self._asked_at > idle_after:
                    self._kept_warm = False
                else:
                    await self._read_fleet(force=True)
                    self._kept_warm = True
            except Exception as err:
                self._kept_warm = False  # requests read for themselves until a listing succeeds
                log.warning("fleet_refresh_failed", error=str(err))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=period)
        self._kept_warm = False

    async def ready(self) -> bool:
        try:
            await self.clients.s3.head_bucket(Bucket=self.settings.bucket)
        except Exception:  # any failure means not ready
            return False
        return True

    async def latest(self, factory_id: str) -> Item:
        """The factory's LATEST, or a 404 naming why."""
        try:
            fid = keys.factory(factory_id)
        except ContractError as err:
            raise ApiError(404, "unknown_factory", f"no factory {factory_id!r}: {err}") from None
        item = await self.readmodel.get_latest(fid)
        if item is None:
            raise ApiError(404, "unknown_factory", f"no factory {fid!r} in the read model")
        return item

    async def link(self, key: str, **fields: Any) -> ImageLink:
        ttl = self.settings.dashboard_presign_ttl_s
        url = await self.clients.s3.generate_presigned_url(
            "get_object", Params={"Bucket": self.settings.bucket, "Key": key}, ExpiresIn=ttl
        )
        return ImageLink(s3_key=key, url=url, expires_in_s=ttl, **fields)


def _iso_date(value: object) -> object:
    # pydantic would also take a number of seconds since 1970 ("?date=0"): only YYYY-MM-DD here
    if isinstance(value, str) and not _ISO_DATE.fullmatch(value):
        raise ValueError("a date is YYYY-MM-DD")
    return value


_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
IsoDate = Annotated[date, BeforeValidator(_iso_date)]

NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": Problem}, 401: {"model": Problem}}
UNAUTHORIZED: dict[int | str, dict[str, Any]] = {401: {"model": Problem}}
FORBIDDEN: dict[int | str, dict[str, Any]] = {401: {"model": Problem}, 403: {"model": Problem}}
# what each route does (aegis_dashboard_api.authz): read a factory of the path, read what
# belongs to no factory, read a list filtered to the identity's factories
READ_FACTORY = Permission(Act.READ, "path")
READ_PLATFORM = Permission(Act.READ, "platform")
READ_LISTED = Permission(Act.READ, "listed")
ADMINISTER = Permission(Act.ADMINISTER, "platform")

router = APIRouter()


def _reader(request: Request) -> Reader:
    reader: Reader = request.app.state.reader
    return reader


def _age_s(at: object, now: datetime) -> float | None:
    if not isinstance(at, str):
        return None
    try:
        return round((now - parse_ts(at)).total_seconds(), 3)
    except ValueError:
        return None


def _newer_of(base: list[Item], newer: list[Item], *, add: bool) -> list[Item]:
    """``base`` with each factory's item replaced by the one of ``newer`` when that one is at
    least as recent (``updated_at``); with ``add``, ``newer``'s other factories are appended. A
    listing that started before a change event never takes the event's state back."""
    latest = {str(i.get("factory_id")): i for i in newer}
    out: list[Item] = []
    for item in base:
        other = latest.pop(str(item.get("factory_id")), None)
        recent = other is not None and str(other.get("updated_at") or "") >= str(
            item.get("updated_at") or ""
        )
        out.append(other if recent and other is not None else item)
    return out + list(latest.values()) if add else out


def fleet_entry(item: Item, now: datetime) -> FleetEntry:
    risk = item.get("risk") or {}
    pipeline = item.get("pipeline_status") or {}
    at = item.get("last_factory_state_at")
    return FleetEntry(
        factory_id=str(item.get("factory_id") or str(item["pk"]).removeprefix("FACTORY#")),
        level=risk.get("level"),
        score=risk.get("score"),
        reasons=list(risk.get("reasons") or []),
        last_factory_state_at=at if isinstance(at, str) else None,
        age_s=_age_s(at, now),
        pipeline_status=pipeline.get("status"),
        updated_at=item.get("updated_at"),
    )


@router.get(
    "/fleet", response_model=Fleet, responses=UNAUTHORIZED, dependencies=[Depends(READ_LISTED)]
)
async def fleet(request: Request) -> Fleet:
    """Every factory's level, score, reasons, freshness and pipeline status."""
    reader = _reader(request)
    now = reader.clock()
    who = identity_of(request)
    entries = [fleet_entry(i, now) for i in await reader.fleet_items()]
    seen = [e for e in entries if decide(who, Act.READ, e.factory_id)]
    return Fleet(generated_at=format_ts(now), factories=seen)


@router.get(
    "/factories/{factory_id}",
    response_model=Factory,
    responses=NOT_FOUND,
    dependencies=[Depends(READ_FACTORY)],
)
async def factory(factory_id: str, request: Request) -> Factory:
    """One factory's LATEST item."""
    item = await _reader(request).latest(factory_id)
    announce_select(request, "factory", factory_id, view="latest", factory=factory_id)
    return Factory(factory_id=factory_id, latest=item)


@router.get(
    "/factories/{factory_id}/history",
    response_model=History,
    responses=NOT_FOUND,
    dependencies=[Depends(READ_FACTORY)],
)
async def history(factory_id: str, request: Request, window: Window = "1h") -> History:
    """1h: HISTORY#STATE (raw resolution); 6h/12h/24h: GRAPH#5M buckets. Expired items left out."""
    reader = _reader(request)
    await reader.latest(factory_id)
    family, items = await reader.readmodel.factory_window(factory_id, window, now=reader.clock())
    announce_select(request, "factory", factory_id, view="history", factory=factory_id)
    return History(factory_id=factory_id, window=window, family=family, items=items)


@router.get(
    "/cloud", response_model=Cloud, responses=FORBIDDEN, dependencies=[Depends(READ_PLATFORM)]
)
async def cloud(request: Request) -> Cloud:
    """CLOUD#infra LATEST with the fast (6 h) and slow (24 h) history."""
    reader = _reader(request)
    now = reader.clock()
    return Cloud(
        latest=await reader.readmodel.get_cloud_latest(),
        fast=await reader.readmodel.cloud_window("fast", now=now),
        slow=await reader.readmodel.cloud_window("slow", now=now),
    )


@router.get(
    "/alerts", response_model=Alerts, responses=UNAUTHORIZED, dependencies=[Depends(READ_LISTED)]
)
async def alerts(request: Request) -> Alerts:
    """Alerts firing now (ALERT# states with firing = true, expired ones left out)."""
    reader = _reader(request)
    who = identity_of(request)
    firing = await reader.readmodel.firing_alerts(now=reader.clock())
    return Alerts(alerts=[a for a in firing if decide(who, Act.READ, factory_of(alert_scope(a)))])


@router.get(
    "/factories/{factory_id}/images/latest",
    response_model=LatestImage,
    responses=NOT_FOUND,
    dependencies=[Depends(READ_FACTORY)],
)
async def latest_image(factory_id: str, request: Request) -> LatestImage:
    """The latest camera image as a short-lived presigned URL; null when there is none."""
    reader = _reader(request)
    ref = (await reader.latest(factory_id)).get("latest_image_snapshot")
    if not isinstance(ref, dict) or not ref.get("s3_key"):
        return LatestImage(factory_id=factory_id, image=None)
    image = await reader.link(
        str(ref["s3_key"]),
        size_bytes=ref.get("size_bytes"),
        captured_at=ref.get("captured_at"),
        camera_id=ref.get("camera_id"),
        content_type=ref.get("content_type"),
    )
    announce_select(request, "factory", factory_id, view="images", factory=factory_id)
    return LatestImage(factory_id=factory_id, image=image)


@router.get(
    "/factories/{factory_id}/images",
    response_model=DayImages,
    responses=NOT_FOUND,
    dependencies=[Depends(READ_FACTORY)],
)
async def day_images(
    factory_id: str,
    request: Request,
    day: Annotated[IsoDate, Query(alias="date", description="UTC day")],
) -> DayImages:
    """A UTC day's camera images, oldest first, as short-lived presigned URLs."""
    reader = _reader(request)
    await reader.latest(factory_id)
    prefix = keys.image_snapshot_day_prefix(factory_id, day)
    images = [
        await reader.link(info.key, size_bytes=info.size_bytes)
        async for info in reader.store.list_objects(prefix)
    ]
    announce_select(request, "factory", factory_id, view="images", factory=factory_id)
    return DayImages(factory_id=factory_id, day=day, images=images)


@router.get(
    "/reports", response_model=Reports, responses=UNAUTHORIZED, dependencies=[Depends(READ_LISTED)]
)
async def reports(
    request: Request, day: Annotated[IsoDate, Query(alias="date", description="KST report date")]
) -> Reports:
    """The reports of one KST date: each target with the artifacts written for it."""
    reader = _reader(request)
    prefix = keys.report_prefix(day)
    by_target: dict[str, list[str]] = {}
    async for info in reader.store.list_objects(prefix):
        target, _, artifact = info.key.removeprefix(prefix).partition("/")
        if artifact:
            by_target.setdefault(target, []).append(artifact)
    who = identity_of(request)
    entries = [
        ReportEntry(target=t, artifacts=a)
        for t, a in sorted(by_target.items())
        if decide(who, Act.READ, factory_of(t))
    ]
    return Reports(day=day, reports=entries)


@router.get(
    "/reports/{report_date}/{target}",
    response_class=Response,
    responses={
        200: {
            "description": "report.md as written, or rendered as HTML",
            "content": {
                "text/markdown": {"schema": {"type": "string"}},
                "text/html": {"schema": {"type": "string"}},
            },
        },
        404: {"model": Problem},
        401: {"model": Problem},
        403: {"model": Problem},
    },
    dependencies=[Depends(Permission(Act.READ, "path", param="target"))],
)
async def report(
    report_date: IsoDate,
    target: str,
    request: Request,
    output: Annotated[Literal["markdown", "html"], Query(alias="format")] = "markdown",
) -> Response:
    """A target's report.md as written (text/markdown), or rendered (``?format=html``)."""
    reader = _reader(request)
    try:
        key = keys.report_key(report_date, target, keys.ReportArtifact.REPORT)
    except ContractError as err:
        raise ApiError(404, "unknown_target", f"no report target {target!r}: {err}") from None
    try:
        body = await reader.store.get_bytes(key)
    except NotFound:
        raise ApiError(
            404, "no_report", f"no report for {target!r} on {report_date.isoformat()}"
        ) from None
    if output == "html":
        # raw HTML in a report is escaped, not passed through
        html = MarkdownIt("commonmark", {"html": False}).render(body.decode("utf-8", "replace"))
        return HTMLResponse(html)
    return Response(body, media_type="text/markdown; charset=utf-8")


@router.get(
    "/audit", response_model=AuditDay, responses=FORBIDDEN, dependencies=[Depends(ADMINISTER)]
)
async def audit_day(
    request: Request, day: Annotated[IsoDate, Query(alias="date", description="UTC day")]
) -> AuditDay:
    """What people did (and were refused) on a UTC day, newest first: admins only."""
    await audit.settled(request.app)  # this replica's own records are in it
    events, total = await AuditLog(_reader(request).store).day(day)
    return AuditDay(day=day, total=total, events=events)
