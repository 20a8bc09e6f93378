"""Triggers: what an event means to the job model, the index that finds the jobs an event can
start, and the fires of cron schedules.

An event is reduced to a :class:`Trigger`: (trigger type, object id, sub type) and its data, the
document trigger conditions and TRIGGER_DATA params read. The :class:`TriggerIndex` keeps the
firing jobs by that triple, so evaluating an event touches only its own jobs (plus those
registered with ``*`` for object or sub type), each with its condition compiled once.

- BizObject: a read-model change (``ChangeEvent``): object = entity (``factory_latest``,
  ``alert``, ... :data:`aegis_contracts.subjects.CHANGE_ENTITIES`), sub type Insert/Update/Delete,
  data ``{table, pk, sk, beforeData, afterData, at}`` (plus ``expired: true`` for a Delete of
  an item whose ttl passed, announced from the table's stream).
- Platform: a device message (``RawArchived``): object = source type, sub type ``Insert``, data the
  event plus ``payload`` when the message is small JSON.
- Automation: a system event: object = its producer (``alert-dispatcher``), sub type = its kind
  (``alert_sent``), data ``{kind, producer, at, detail}``; a sign-in on the dashboard is the
  sub type ``Login`` (object ``dashboard-api``, kind ``login``), with ``detail.outcome`` ok,
  refused or failed and ``detail.exception`` why (``wrong_token``, ``locked``,
  ``unknown_user``, ``provider_refused``, ``provider_unreachable``; null on success); a read
  of one factory, incident or job through the dashboard's API is the sub type ``Select``
  (kind ``select``), with ``detail.entity``, ``detail.id``, ``detail.view`` and who read it.
- Component: an S3 object written (``ObjectCreated``): object = the key's family (the last token
  of ``aegis.objects.created.{family}``), sub type ``Insert``, data ``{family, bucket, key,
  size_bytes, etag, producer, created_at}``; a bucket, prefix or key pattern is a condition on
  the data (``StringMatches([$.key], "reports/daily/*")``).
- Schedule: a cron fire: data ``{scheduled_for, time_zone}``.

Each trigger also names the factory its event belongs to, when it belongs to one (a change's
``pk`` or image ``factory_id``, a device message's ``factory_id``, an object key's factory, a
system event's ``detail.factory_id``, ``factory``, ``scope`` or ``target``): a job of a tenant
starts only for the factories of its tenant (:mod:`aegis_orchestration.tenants`).

An event made by ``aegis replay`` (``replayed``, unless the operator replayed with ``--notify``)
starts no job: a replay restores history, it does not report news.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from croniter import croniter

from aegis_contracts.errors import ContractError
from aegis_contracts.keys import CLOUD_INFRA_TARGET, parse_key
from aegis_orchestration.dsl import Expression, parse
from aegis_orchestration.model import Job, MisfirePolicy, TriggerType
from aegis_orchestration.tenants import Tenants

SUB_TYPES = {"INSERT": "Insert", "MODIFY": "Update", "REMOVE": "Delete"}


@dataclass(frozen=True, slots=True)
class Trigger:
    type: TriggerType
    object_id: str
    sub_type: str
    data: dict[str, Any]
    replayed: bool = False  # made by a replayed message: fires nothing
    factory: str | None = None  # the factory the event belongs to (None: none)


def _factory(value: Any) -> str | None:
    """A factory id an event names (the cloud's own scope, ``cloud-infra``, is none)."""
    if isinstance(value, str) and value and value != CLOUD_INFRA_TARGET:
        return value
    return None


# the partition keys of the read model's items that belong to one factory: FACTORY#{id} (its
# LATEST, late-data markers, graph windows) and ALERT#{scope} (its alerts)
_FACTORY_PKS = ("FACTORY#", "ALERT#")


def change_factory(change: Mapping[str, Any]) -> str | None:
    """The factory of a read-model change: its key's, else its image's ``factory_id``."""
    pk = change.get("pk")
    if isinstance(pk, str):
        for prefix in _FACTORY_PKS:
            if pk.startswith(prefix):
                return _factory(pk.removeprefix(prefix))
    for image in (change.get("new_image"), change.get("old_image")):
        if isinstance(image, Mapping) and (found := _factory(image.get("factory_id"))):
            return found
    return None


def object_factory(key: Any) -> str | None:
    """The factory of an object key of the storage contract (a report's or incident's target);
    None for a key of no factory or outside the contract."""
    try:
        info = parse_key(str(key))
    except ContractError:
        return None
    return _factory(info.factory_id or info.target)


def biz_object_trigger(change: Mapping[str, Any], entity: str) -> Trigger:
    return Trigger(
        TriggerType.BIZ_OBJECT,
        entity,
        SUB_TYPES.get(str(change.get("event_name")), str(change.get("event_name"))),
        {
            "table": change.get("table"),
            "pk": change.get("pk"),
            "sk": change.get("sk"),
            "beforeData": change.get("old_image"),
            "afterData": change.get("new_image"),
            "at": change.get("at"),
            # a delete by DynamoDB's TTL process, not by a writer (only then present)
            **({"expired": True} if change.get("expired") is True else {}),
        },
        replayed=change.get("replayed") is True,
        factory=change_factory(change),
    )


def platform_trigger(raw: Mapping[str, Any]) -> Trigger:
    data = dict(raw)
    text = raw.get("payload_text")
    if isinstance(text, str):
        try:
            data["payload"] = json.loads(text)
        except ValueError:
            data["payload"] = None
        data.pop("payload_text", None)
    return Trigger(
        TriggerType.PLATFORM,
        str(raw.get("source_type")),
        "Insert",
        data,
        replayed=raw.get("replayed") is True,
        factory=_factory(raw.get("factory_id")),
    )


# system event kinds that are the Automation sub types of the job model's own vocabulary
AUTOMATION_SUB_TYPES = {"login": "Login", "select": "Select"}


# where a system event's detail names its factory: a job's, a read's, an alert's, a report's
_DETAIL_FACTORY = ("factory_id", "factory", "scope", "target")


def automation_trigger(event: Mapping[str, Any]) -> Trigger:
    kind = str(event.get("kind"))
    detail = event.get("detail")
    named = detail if isinstance(detail, Mapping) else {}
    return Trigger(
        TriggerType.AUTOMATION,
        str(event.get("producer")),
        AUTOMATION_SUB_TYPES.get(kind, kind),
        dict(event),
        factory=next((f for k in _DETAIL_FACTORY if (f := _factory(named.get(k)))), None),
    )


def component_trigger(created: Mapping[str, Any], family: str) -> Trigger:
    return Trigger(
        TriggerType.COMPONENT,
        family,
        "Insert",
        {"family": family, **created},
        replayed=created.get("replayed") is True,
        factory=object_factory(created.get("key")),
    )


def schedule_trigger(job: Job, scheduled_for: datetime) -> Trigger:
    return Trigger(
        TriggerType.SCHEDULE,
        job.object_id or "*",
        job.trigger_sub_type or "*",
        {"scheduled_for": scheduled_for.isoformat(), "time_zone": job.time_zone, "job_id": job.id},
    )


@dataclass(frozen=True, slots=True)
class _Entry:
    job: Job
    condition: Expression | None


class TriggerIndex:
    """The firing event-triggered jobs by (type, object, sub type); rebuilt on every change.
    ``tenants`` scope the jobs that have a tenant (none declared: those never start)."""

    def __init__(self, jobs: Iterable[Job] = (), tenants: Tenants | None = None) -> None:
        self._by_key: dict[tuple[str, str, str], list[_Entry]] = {}
        self._jobs: dict[str, Job] = {}
        self.tenants = tenants if tenants is not None else Tenants()
        for job in jobs:
            self.put(job)

    def put(self, job: Job) -> None:
        self.remove(job.id)
        self._jobs[job.id] = job
        if not job.fires or job.trigger_type is TriggerType.SCHEDULE:
            return
        condition = parse(job.trigger_condition_expr) if job.trigger_condition_expr else None
        self._by_key.setdefault(job.trigger_key(), []).append(_Entry(job, condition))

    def remove(self, job_id: str) -> None:
        old = self._jobs.pop(job_id, None)
        if old is None:
            return
        entries = self._by_key.get(old.trigger_key(), [])
        entries[:] = [e for e in entries if e.job.id != job_id]

    def jobs(self) -> list[Job]:
        return list(self._jobs.values())

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def schedules(self) -> list[Job]:
        """The firing schedule jobs (a tenant's only when its tenant is declared: a cron fire is
        the job's own, of no factory, and always starts it)."""
        return [
            j
            for j in self._jobs.values()
            if j.fires
            and j.trigger_type is TriggerType.SCHEDULE
            and self.tenants.skip(j, None, own=True) is None
        ]

    def undeclared(self) -> list[Job]:
        """The firing jobs whose tenant is not declared: no trigger starts them."""
        return [j for j in self._jobs.values() if j.fires and self.tenants.refusal(j)]

    def matching(self, trigger: Trigger) -> list[Job]:
        """The jobs this trigger starts: same key (or ``*``), condition holds (never raises);
        none for a replayed event."""
        return self.evaluate(trigger).fired

    def evaluate(self, trigger: Trigger) -> Evaluation:
        """The jobs whose key (type, object or ``*``, sub type or ``*``) the trigger has, split
        into those it starts and those it does not: a replayed event starts nothing, a tenant's
        job starts only for its tenant's factories (the condition is not even read for another
        tenant's), and a job whose condition does not hold stays. Jobs of other keys are not
        looked at."""
        t, o, s = trigger.type.value, trigger.object_id, trigger.sub_type
        result = Evaluation([], [])
        for key in {(t, o, s), (t, "*", s), (t, o, "*"), (t, "*", "*")}:
            for entry in self._by_key.get(key, ()):
                if trigger.replayed:
                    result.skipped.append((entry.job, "replayed"))
                elif refused := self.tenants.skip(entry.job, trigger.factory):
                    result.skipped.append((entry.job, refused))
                elif entry.condition is None or entry.condition(trigger.data):
                    result.fired.append(entry.job)
                else:
                    result.skipped.append((entry.job, "condition"))
        return result


@dataclass(frozen=True, slots=True)
class Evaluation:
    """What one trigger did to the jobs of its key: ``fired`` starts them, ``skipped`` holds each
    job left alone and why (``condition``: its trigger condition was false; ``replayed``; for a
    tenant's job ``factory_out_of_scope``, ``no_factory`` or ``tenant_undeclared``)."""

    fired: list[Job]
    skipped: list[tuple[Job, str]]


# -- schedules ------------------------------------------------------------------------------------


def fires_between(cron: str, time_zone: str, after: datetime, until: datetime) -> list[datetime]:
    """Cron fires in ``(after, until]`` (aware datetimes; the cron is read in ``time_zone``)."""
    tz = ZoneInfo(time_zone)
    it = croniter(cron, after.astimezone(tz))
    fires: list[datetime] = []
    while True:
        nxt = it.get_next(datetime)
        if nxt > until:
            return fires
        fires.append(nxt)
        if len(fires) > 10_000:
            return fires


def next_fire(cron: str, time_zone: str, after: datetime) -> datetime:
    it = croniter(cron, after.astimezone(ZoneInfo(time_zone)))
    result: datetime = it.get_next(datetime)
    return result


def due_fires(
    job: Job,
    last_checked: datetime | None,
    now: datetime,
    *,
    tick: timedelta = timedelta(seconds=2),
) -> list[datetime]:
    """The fires of ``job`` to run now. After a tick at ``last_checked``, every fire since is on
    time. On a replica's first tick, fires within ``misfire_grace_s`` were missed (nobody ran, or
    another replica did: the per-fire claim tells) and are caught up by the misfire policy; a fire
    within the last ``tick`` counts as on time."""
    assert job.trigger_cron is not None
    if last_checked is not None:
        return fires_between(job.trigger_cron, job.time_zone, last_checked, now)
    window = max(timedelta(seconds=job.misfire_grace_s), tick)
    fires = fires_between(job.trigger_cron, job.time_zone, now - window, now)
    on_time = [f for f in fires if f > now - tick]
    missed = [f for f in fires if f <= now - tick]
    if not missed or job.misfire_policy is MisfirePolicy.SKIP:
        return on_time
    if job.misfire_policy is MisfirePolicy.FIRE_ONCE:
        return on_time or missed[-1:]
    return missed + on_time
