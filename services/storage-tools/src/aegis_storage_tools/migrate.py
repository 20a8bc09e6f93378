"""``aegis migrate``: plan and run a prefix migration inside one bucket.

Plan: list every source prefix and every target prefix once, map each key (:mod:`rules`) and sort
it into ``copy`` (destination absent), ``present`` (destination has the same body: an earlier run
copied it) or ``conflict`` (destination has another body: reported, never touched, the source is
kept). Run: server-side copies with bounded parallelism (UploadPartCopy parts above the multipart
threshold), each pinned to the listed source ETag (CopySourceIfMatch); for raw targets each copy
is conditional (If-None-Match: *), so a destination written after the plan listed the targets is
refused by the store and reported, never overwritten: one request per object, no look-before-copy
(S3 honours it on CopyObject; so does AEGIS's local emulator, see aegis_devstack.motoserver).
Then the targets are listed
again and every copy verified (size, and ETag: the MD5 of the body, or for a multipart copy the
ETag the upload completed with); only verified sources are deleted, in DeleteObjects batches of
1000. Everything is decided again from the bucket on each run, so an interrupted run is finished
by running it again and nothing is done twice; the journal JSON records each run and each key.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from aegis_contracts.times import format_ts, parse_ts, utc_now
from aegis_storage.errors import Conflict, StorageError
from aegis_storage.s3 import (
    COPY_OBJECT_MAX_BYTES,
    COPY_PART_BYTES,
    ObjectInfo,
    ObjectStore,
    is_multipart_etag,
)
from aegis_storage_tools.progress import Quiet, Tracker
from aegis_storage_tools.rules import BESIDE, Move, RuleSet, Skip, TargetClass, map_key

log = structlog.get_logger("aegis_storage_tools.migrate")

COPY = "copy"
PRESENT = "present"
CONFLICT = "conflict"
# skip reasons too numerous to list key by key in the journal (all of raw/ under aegis-legacy)
_COUNT_ONLY = {"not_flat_legacy", "in_place"}


@dataclass(slots=True)
class Planned:
    move: Move
    source: ObjectInfo
    state: str  # COPY | PRESENT | CONFLICT
    detail: str = ""


@dataclass(slots=True)
class RuleTotals:
    objects: int = 0
    bytes: int = 0
    copy: int = 0
    present: int = 0
    conflicts: int = 0


@dataclass(slots=True)
class Plan:
    items: list[Planned]
    skipped: list[Skip]

    def totals(self) -> dict[str, RuleTotals]:
        out: dict[str, RuleTotals] = {}
        for p in self.items:
            t = out.setdefault(p.move.rule, RuleTotals())
            t.objects += 1
            t.bytes += p.source.size_bytes
            t.copy += p.state == COPY
            t.present += p.state == PRESENT
            t.conflicts += p.state == CONFLICT
        return out

    @property
    def conflicts(self) -> list[Planned]:
        return [p for p in self.items if p.state == CONFLICT]

    def skip_counts(self) -> dict[str, int]:
        return dict(Counter(s.reason for s in self.skipped))

    def as_dict(self) -> dict[str, Any]:
        return {
            "rules": {name: asdict(t) for name, t in sorted(self.totals().items())},
            "skipped": self.skip_counts(),
            "conflicts": [
                {"source": p.move.source, "dest": p.move.dest, "detail": p.detail}
                for p in self.conflicts
            ],
        }


@dataclass(frozen=True, slots=True)
class CopyOptions:
    concurrency: int = 32
    multipart_threshold: int = COPY_OBJECT_MAX_BYTES
    part_bytes: int = COPY_PART_BYTES


@dataclass(slots=True)
class Summary:
    planned: int = 0
    copied: int = 0
    present: int = 0
    verified: int = 0
    deleted: int = 0
    conflicts: int = 0
    failed: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def objects_per_second(self) -> float:
        return self.planned / self.seconds if self.seconds > 0 else 0.0


# -- the journal -------------------------------------------------------------------------------


class Journal:
    """The JSON record of a migration: one entry per run (options, summary) and one per source key
    (destination, rule, state, why). Re-runs load it and add to it; written atomically."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.doc: dict[str, Any] = {"version": 1, "runs": [], "objects": {}}
        if path is not None and path.exists():
            self.doc = json.loads(path.read_text(encoding="utf-8"))

    @property
    def objects(self) -> dict[str, dict[str, Any]]:
        return self.doc["objects"]  # type: ignore[no-any-return]

    def record(self, move: Move, state: str, **detail: Any) -> None:
        entry = self.objects.setdefault(
            move.source,
            {"dest": move.dest, "rule": move.rule, "class": move.target_class.value},
        )
        entry["dest"] = move.dest
        entry["state"] = state
        entry["at"] = format_ts(utc_now())
        for k, v in detail.items():
            if v is None:
                entry.pop(k, None)
            else:
                entry[k] = v

    def skip(self, skip: Skip) -> None:
        if skip.reason not in _COUNT_ONLY:
            self.objects.setdefault(skip.source, {"rule": skip.rule})
            self.objects[skip.source] |= {"state": "skipped", "reason": skip.reason}

    def start_run(self, **options: Any) -> dict[str, Any]:
        run = {"started_at": format_ts(utc_now()), **options}
        self.doc["runs"].append(run)
        return run

    def save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.path)


# -- planning ----------------------------------------------------------------------------------


def _roots(prefixes: Iterable[str]) -> list[str]:
    """The prefixes not under another one of them: each is listed once."""
    ordered = sorted(set(prefixes))
    return [p for p in ordered if not any(p != q and p.startswith(q) for q in ordered)]


async def _listing(store: ObjectStore, prefixes: Iterable[str]) -> dict[str, ObjectInfo]:
    found: dict[str, ObjectInfo] = {}
    for prefix in _roots(prefixes):
        async for info in store.list_objects(prefix):
            found[info.key] = info
    return found


def _target_prefixes(rules: RuleSet) -> list[str]:
    out = [r.target for r in rules.rules]
    out += [r.sidecars for r in rules.rules if r.sidecars != BESIDE]
    return out


async def _arrival(store: ObjectStore, info: ObjectInfo) -> datetime:
    """An object's arrival time: ingest's ``received_at`` metadata, else LastModified."""
    head = await store.head(info.key) or {}
    stamp = (head.get("Metadata") or {}).get("received_at")
    if stamp:
        try:
            return parse_ts(stamp)
        except ValueError:
            pass
    return info.last_modified


async def same_body(store: ObjectStore, a: ObjectInfo, b: ObjectInfo) -> bool:
    """Size, then ETag (an MD5 for single-part objects); streamed SHA-256 when either ETag is a
    multipart one."""
    if a.size_bytes != b.size_bytes:
        return False
    if not is_multipart_etag(a.etag) and not is_multipart_etag(b.etag):
        return a.etag == b.etag
    return await store.sha256(a.key) == await store.sha256(b.key)


async def plan(store: ObjectStore, rules: RuleSet, tracker: Tracker | None = None) -> Plan:
    """What a run would do, and nothing changed."""
    tracker = tracker or Quiet()
    tracker.stage("list", None)
    sources = await _listing(store, rules.source_prefixes)
    targets = await _listing(store, _target_prefixes(rules))
    tracker.stage("plan", len(sources))
    items: list[Planned] = []
    skipped: list[Skip] = []
    for key, info in sources.items():
        rule = rules.rule_for(key)
        at = None
        if rule is not None and rule.needs_time and key.count("/") - rule.source.count("/") == 2:
            at = await _arrival(store, info)
        mapped = map_key(key, rules, at=at)
        tracker.advance()
        if isinstance(mapped, Skip):
            skipped.append(mapped)
            continue
        existing = targets.get(mapped.dest)
        if existing is None:
            items.append(Planned(mapped, info, COPY))
        elif await same_body(store, info, existing):
            items.append(Planned(mapped, info, PRESENT))
        else:
            detail = (
                f"{mapped.dest} exists with another body ({existing.size_bytes} bytes, "
                f"ETag {existing.etag}; source {info.size_bytes} bytes, ETag {info.etag})"
            )
            items.append(Planned(mapped, info, CONFLICT, detail))
    return Plan(items, skipped)


# -- running -----------------------------------------------------------------------------------


class Migrator:
    def __init__(
        self,
        store: ObjectStore,
        rules: RuleSet,
        *,
        journal: Journal | None = None,
        options: CopyOptions | None = None,
        tracker: Tracker | None = None,
    ) -> None:
        self.store = store
        self.rules = rules
        self.journal = journal or Journal(None)
        self.options = options or CopyOptions()
        self.tracker = tracker or Quiet()
        self._copied: dict[str, str] = {}  # dest -> ETag the copy reported

    async def run(self, *, delete: bool = True) -> Summary:
        started = asyncio.get_running_loop().time()
        run = self.journal.start_run(
            rules=self.rules.name,
            bucket=self.store.bucket,
            mode="copy+verify+delete" if delete else "copy-only",
        )
        summary = Summary()
        try:
            the_plan = await plan(self.store, self.rules, self.tracker)
            summary.planned = len(the_plan.items)
            summary.skipped = the_plan.skip_counts()
            for skip in the_plan.skipped:
                self.journal.skip(skip)
            await self._copy_all(the_plan.items, summary)
            verified = await self._verify(the_plan.items, summary)
            if delete:
                await self._delete(verified, summary)
        finally:
            summary.seconds = round(asyncio.get_running_loop().time() - started, 3)
            run["finished_at"] = format_ts(utc_now())
            run["summary"] = asdict(summary)
            self.journal.save()
        log.info("migration_finished", **asdict(summary))
        return summary

    async def _copy_all(self, items: list[Planned], summary: Summary) -> None:
        for p in items:
            if p.state == CONFLICT:
                summary.conflicts += 1
                self.journal.record(p.move, CONFLICT, detail=p.detail)
                log.warning("migration_conflict", source=p.move.source, detail=p.detail)
            elif p.state == PRESENT:
                summary.present += 1
                if self.journal.objects.get(p.move.source, {}).get("state") != PRESENT:
                    self.journal.record(p.move, PRESENT)
        todo = [p for p in items if p.state == COPY]
        self.tracker.stage("copy", len(todo))
        gate = asyncio.Semaphore(self.options.concurrency)

        async def one(p: Planned) -> None:
            async with gate:
                await self._copy_one(p, summary)
            self.tracker.advance()

        try:
            async with asyncio.TaskGroup() as tasks:
                for p in todo:
                    tasks.create_task(one(p))
        finally:
            self.journal.save()  # what was copied before a crash is on record

    async def _copy_one(self, p: Planned, summary: Summary) -> None:
        move, raw = p.move, p.move.target_class is TargetClass.RAW
        try:
            try:
                result = await self.store.copy(
                    p.source,
                    move.dest,
                    if_absent=raw,
                    multipart_threshold=self.options.multipart_threshold,
                    part_bytes=self.options.part_bytes,
                )
            except Conflict:  # If-None-Match: it was written after the plan listed the targets
                await self._settle_existing(p, summary)
                return
        except StorageError as err:
            summary.failed += 1
            p.state = "failed"
            self.journal.record(move, "failed", error=str(err))
            log.warning("migration_copy_failed", source=move.source, error=str(err))
            return
        self._copied[move.dest] = result.etag
        summary.copied += 1
        self.journal.record(move, "copied", etag=result.etag, parts=result.parts or None)

    async def _settle_existing(self, p: Planned, summary: Summary) -> None:
        listing = [i async for i in self.store.list_objects(p.move.dest) if i.key == p.move.dest]
        if listing and await same_body(self.store, p.source, listing[0]):
            p.state = PRESENT
            summary.present += 1
            self.journal.record(p.move, PRESENT)
            return
        p.state = CONFLICT
        p.detail = f"{p.move.dest} appeared with another body during the run"
        summary.conflicts += 1
        self.journal.record(p.move, CONFLICT, detail=p.detail)
        log.warning("migration_conflict", source=p.move.source, detail=p.detail)

    async def _verify(self, items: list[Planned], summary: Summary) -> list[Planned]:
        """List the targets again; a copy is verified when the destination has the source's size
        and its ETag (or, for a multipart copy, the ETag the upload completed with)."""
        candidates = [p for p in items if p.state in (COPY, PRESENT)]
        self.tracker.stage("verify", len(candidates))
        if not candidates:
            return []
        dests = await _listing(self.store, {_parent(p.move.dest) for p in candidates})
        verified: list[Planned] = []
        for p in candidates:
            self.tracker.advance()
            if p.state == COPY and p.move.dest not in self._copied:
                continue  # its copy failed: already counted
            found = dests.get(p.move.dest)
            ok = found is not None and found.size_bytes == p.source.size_bytes
            if ok and found is not None:
                expected = {p.source.etag, self._copied.get(p.move.dest, p.source.etag)}
                ok = found.etag in expected or (
                    p.state == PRESENT and await same_body(self.store, p.source, found)
                )
            if ok:
                verified.append(p)
                summary.verified += 1
                self.journal.record(p.move, "verified")
            else:
                summary.failed += 1
                detail = "missing" if found is None else f"{found.size_bytes} bytes, {found.etag}"
                self.journal.record(p.move, "failed", error=f"verification failed: {detail}")
                log.warning("migration_verify_failed", source=p.move.source, found=detail)
        return verified

    async def _delete(self, verified: list[Planned], summary: Summary) -> None:
        self.tracker.stage("delete", len(verified))
        keys = [p.move.source for p in verified]
        failed = set(await self.store.delete_many(keys))
        self.tracker.advance(len(keys))
        for p in verified:
            if p.move.source in failed:
                summary.failed += 1
                self.journal.record(p.move, "failed", error="DeleteObjects reported an error")
            else:
                summary.deleted += 1
                self.journal.record(p.move, "deleted")


def _parent(key: str) -> str:
    return key.rsplit("/", 1)[0] + "/" if "/" in key else ""
