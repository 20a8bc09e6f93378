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
ETag the upload completed with); the raw partitions the verified copies lie in are sealed
(:mod:`seal`: a migration fills past days, which the daily seal's lookback never reaches), and
only verified sources are deleted, in DeleteObjects batches of 1000. Everything is decided
again from the bucket on each run, so an interrupted run is finished by running it again and
nothing is done twice; the journal JSON records each run and each key.

Deletes the storage-tools role may not make (under raw/: see :mod:`rules`, ``ROLE_REFUSED``) are
known before anything is copied: the plan says so per rule, and a run refuses to start while any
such source would be moved, unless it keeps those sources (``keep_sources``): copied and verified,
then handed over as DeleteObjects batches (and the commands to run them as the raw break-glass
role) in a folder beside the journal. In a versioned bucket a deleted source leaves its versions
behind; ``purge_versions`` then deletes, by version id, every version and delete marker of each
source this run deleted (and of those an interrupted purging run left pending in the journal),
never one under a target prefix, never a key an object was written to again since; the plan
lists the versions under the source prefixes to say what that would free.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import structlog

from aegis_contracts.times import format_ts, parse_ts, utc_now
from aegis_storage.errors import Conflict, StorageError
from aegis_storage.s3 import (
    COPY_OBJECT_MAX_BYTES,
    COPY_PART_BYTES,
    DELETE_BATCH,
    ObjectInfo,
    ObjectStore,
    VersionInfo,
    is_multipart_etag,
)
from aegis_storage_tools.progress import Quiet, Tracker
from aegis_storage_tools.rules import (
    BESIDE,
    BREAK_GLASS,
    DELETE_OBJECT,
    DELETE_OBJECT_VERSION,
    Deletes,
    Move,
    RuleSet,
    Skip,
    TargetClass,
    map_key,
    refused_reason,
    role_may,
    source_deletes,
)
from aegis_storage_tools.seal import Sealer, partition_of

log = structlog.get_logger("aegis_storage_tools.migrate")

COPY = "copy"
PRESENT = "present"
CONFLICT = "conflict"
KEPT = "kept"  # verified, its delete handed over (the role may not make it)
PENDING = "pending"  # a purge of versions to finish
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
class PurgeFigures:
    """What ``purge_versions`` frees (a plan's estimate, or what a run did): ``keys`` moved
    sources, their object ``versions`` and ``bytes``, and their delete markers (the one each
    source's delete leaves included); ``left``: moved sources whose versions stay (the role may
    not delete them, they lie under a target prefix, or an object was written there again)."""

    keys: int = 0
    versions: int = 0
    bytes: int = 0
    markers: int = 0
    left: int = 0


class SourcesNotDeletable(Exception):
    """The run would move sources that the storage-tools role may not delete; nothing was done."""


@dataclass(slots=True)
class Plan:
    items: list[Planned]
    skipped: list[Skip]
    deletes: dict[str, Deletes] = field(default_factory=dict)  # rule -> may its sources go?
    purge: PurgeFigures | None = None  # listed only when asked (the versions of the sources)
    purge_error: str | None = None  # the versions could not be listed (the plan stands)

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
            "deletes": {name: d.value for name, d in sorted(self.deletes.items())},
            "purge_versions": None if self.purge is None else asdict(self.purge),
            **({"purge_versions_error": self.purge_error} if self.purge_error else {}),
        }

    def notes(self) -> list[str]:
        """The plan's lines about deletes (per rule) and what ``--purge-versions`` would free."""
        lines = []
        for name, deletes in sorted(self.deletes.items()):
            if deletes is Deletes.YES:
                lines.append(f"  {name:<12} deletes: yes (the storage-tools role may delete them)")
                continue
            which = "its sources" if deletes is Deletes.NO else "some of its sources"
            lines.append(
                f"  {name:<12} deletes: NO: the storage-tools role may not delete {which} "
                f"(the bucket policy leaves raw/ deletes to {BREAK_GLASS}); `migrate run` "
                "refuses it unless --keep-sources (copy, verify, hand the deletes over) or "
                "--no-delete"
            )
        if self.purge_error is not None:
            lines.append(f"  purge-versions: unknown: {self.purge_error}")
        if self.purge is not None:
            p = self.purge
            lines.append(
                f"  purge-versions: would free {p.versions} versions ({p.bytes} bytes) and "
                f"{p.markers} delete markers of {p.keys} moved keys"
                + (f"; the versions of {p.left} moved keys would stay" if p.left else "")
            )
        return lines


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
    kept: int = 0  # verified sources the role may not delete: handed over
    handover: str | None = None  # the folder of the hand-over (DeleteObjects batches, commands)
    purged: PurgeFigures | None = None  # with purge_versions
    skipped: dict[str, int] = field(default_factory=dict)
    # the raw partitions the run wrote into, sealed at its end: outcome -> partitions; and those
    # whose day is not over plus grace yet (the daily `aegis seal raw` takes them)
    sealed: dict[str, int] = field(default_factory=dict)
    seal_later: int = 0
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

    def purge(self, key: str, status: str, **detail: Any) -> None:
        """The purge of ``key``'s versions: ``pending`` (its source deleted by a purging run),
        ``done`` (with what was freed), ``skipped`` (with why)."""
        entry = self.objects.setdefault(key, {})
        entry["purge"] = {"status": status, "at": format_ts(utc_now()), **detail}

    def purge_pending(self) -> list[str]:
        return [
            k for k, e in self.objects.items() if (e.get("purge") or {}).get("status") == PENDING
        ]

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


def _purgeable(key: str, rules: RuleSet) -> bool:
    """May ``purge_versions`` touch ``key``'s versions: the role may delete them, and the key is
    under no target prefix (whatever a run wrote is never purged)."""
    return (
        role_may(DELETE_OBJECT, key)
        and role_may(DELETE_OBJECT_VERSION, key)
        and not any(key.startswith(t) for t in _target_prefixes(rules))
    )


def _source_prefix(key: str, rules: RuleSet) -> str:
    rule = rules.rule_for(key)
    return rule.source if rule is not None else _parent(key)


async def _versions_of(
    store: ObjectStore, rules: RuleSet, keys: Iterable[str]
) -> dict[str, list[VersionInfo]]:
    """Every version and delete marker of ``keys``, listed under their source prefixes."""
    found: dict[str, list[VersionInfo]] = {k: [] for k in keys}
    for prefix in _roots({_source_prefix(k, rules) for k in found}):
        async for v in store.list_versions(prefix):
            if v.key in found:
                found[v.key].append(v)
    return found


async def _purge_estimate(store: ObjectStore, rules: RuleSet, items: list[Planned]) -> PurgeFigures:
    moving = {p.move.source for p in items if p.state in (COPY, PRESENT)}
    purgeable = {k for k in moving if _purgeable(k, rules)}
    figures = PurgeFigures(keys=len(purgeable), left=len(moving) - len(purgeable))
    for versions in (await _versions_of(store, rules, purgeable)).values():
        for v in versions:
            figures.markers += v.delete_marker
            figures.versions += not v.delete_marker
            figures.bytes += v.size_bytes
    figures.markers += len(purgeable)  # the delete marker each source's delete leaves
    return figures


async def plan(
    store: ObjectStore,
    rules: RuleSet,
    tracker: Tracker | None = None,
    *,
    versions: bool = False,
) -> Plan:
    """What a run would do, and nothing changed. ``versions``: also list the versions of the
    sources to say what ``purge_versions`` would free."""
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
    the_plan = Plan(items, skipped, {r.name: source_deletes(r) for r in rules.rules})
    if versions:
        tracker.stage("versions", None)
        try:
            the_plan.purge = await _purge_estimate(store, rules, items)
        except StorageError as err:  # e.g. a role without s3:ListBucketVersions
            the_plan.purge_error = f"listing the versions failed: {err}"
    return the_plan


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
        sealer: Sealer | None = None,
        seal_grace: timedelta = timedelta(hours=2),
    ) -> None:
        """``sealer``: seal the raw partitions the run copied into, once copies are verified
        (``aegis migrate run`` always gives one; ``None`` leaves them to ``aegis seal raw``)."""
        self.store = store
        self.rules = rules
        self.sealer = sealer
        self.seal_grace = seal_grace
        self.journal = journal or Journal(None)
        self.options = options or CopyOptions()
        self.tracker = tracker or Quiet()
        self._copied: dict[str, str] = {}  # dest -> ETag the copy reported

    async def run(
        self, *, delete: bool = True, keep_sources: bool = False, purge_versions: bool = False
    ) -> Summary:
        """Copy, verify, delete. ``keep_sources``: sources the role may not delete are kept and
        handed over instead of refusing the run (:class:`SourcesNotDeletable`, raised before
        anything is copied). ``purge_versions``: then delete the versions the deleted sources
        left behind."""
        if purge_versions and not delete:
            raise ValueError("purging the versions of the sources needs their deletes")
        started = asyncio.get_running_loop().time()
        run = self.journal.start_run(
            rules=self.rules.name,
            bucket=self.store.bucket,
            mode="copy+verify+delete" if delete else "copy-only",
            keep_sources=keep_sources,
            purge_versions=purge_versions,
        )
        summary = Summary()
        try:
            the_plan = await plan(self.store, self.rules, self.tracker)
            summary.planned = len(the_plan.items)
            summary.skipped = the_plan.skip_counts()
            for skip in the_plan.skipped:
                self.journal.skip(skip)
            if delete and not keep_sources:
                self._refuse_undeletable(the_plan, run)
            await self._copy_all(the_plan.items, summary)
            verified = await self._verify(the_plan.items, summary)
            if self.sealer is not None:
                await self._seal(self.sealer, verified, summary)
            if delete:
                kept = [p for p in verified if not role_may(DELETE_OBJECT, p.move.source)]
                if kept:
                    run["handover"] = self._hand_over(kept, summary)
                deleted = await self._delete(
                    [p for p in verified if role_may(DELETE_OBJECT, p.move.source)], summary
                )
                if purge_versions:
                    await self._purge(deleted, the_plan, summary)
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

    async def _seal(self, sealer: Sealer, verified: list[Planned], summary: Summary) -> None:
        """Seal every raw partition a verified copy lies in whose day is over plus grace (a
        migration fills past days, which the daily run's lookback may never reach again): a
        partition sealed before gets a supplement for what the run added, one sealed by another
        run is left as it is. The partitions of days not over yet are the daily run's."""
        parts = {
            part
            for p in verified
            if p.move.target_class is TargetClass.RAW
            and (part := partition_of(p.move.dest)) is not None
        }
        due = sealer.due(sorted(parts, key=lambda part: part.prefix), self.seal_grace)
        self.tracker.stage("seal", len(due))
        results = await sealer.partitions(due)
        self.tracker.advance(len(due))
        summary.sealed = dict(Counter(r.outcome.value for r in results))
        summary.seal_later = len(parts) - len(due)
        for r in results:
            if r.error is not None:
                log.warning("migration_seal_failed", prefix=r.partition.prefix, error=r.error)

    async def _delete(self, verified: list[Planned], summary: Summary) -> list[str]:
        """Delete the verified sources; the keys deleted."""
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
        return [k for k in keys if k not in failed]

    def _refuse_undeletable(self, the_plan: Plan, run: dict[str, Any]) -> None:
        """Before any copy: refuse a run that would leave sources behind half-way."""
        blocked = Counter(
            p.move.rule
            for p in the_plan.items
            if p.state in (COPY, PRESENT) and not role_may(DELETE_OBJECT, p.move.source)
        )
        if not blocked:
            return
        example = next(
            p.move.source for p in the_plan.items if not role_may(DELETE_OBJECT, p.move.source)
        )
        rules = ", ".join(f"{name} ({n} objects)" for name, n in sorted(blocked.items()))
        message = (
            f"nothing done: the storage-tools role may not delete the sources of rule(s) {rules}: "
            f"{refused_reason(example)}. Give --keep-sources to copy and verify them and hand "
            "their deletes over, or --no-delete to keep every source"
        )
        run["refused"] = message
        raise SourcesNotDeletable(message)

    def _hand_over(self, kept: list[Planned], summary: Summary) -> str | None:
        """Keep verified sources the role may not delete; with a journal file, write their
        deletes for the break-glass role beside it: DeleteObjects batches of 1000
        (``delete-0001.json``, ...), ``keys.txt`` and ``commands.sh``. A new folder each run:
        nothing written before is overwritten. Its path, or None without a journal file."""
        for p in kept:
            self.journal.record(p.move, KEPT, reason=refused_reason(p.move.source))
        summary.kept = len(kept)
        if self.journal.path is None:
            return None
        stamp = utc_now().strftime("%Y%m%dT%H%M%S%fZ")
        journal = self.journal.path.resolve()
        folder = journal.parent / f"{journal.stem}-handover-{stamp}"
        folder.mkdir(parents=True, exist_ok=False)
        keys = sorted(p.move.source for p in kept)
        commands = []
        for number, start in enumerate(range(0, len(keys), DELETE_BATCH), 1):
            batch = folder / f"delete-{number:04d}.json"
            objects = [{"Key": k} for k in keys[start : start + DELETE_BATCH]]
            batch.write_text(json.dumps({"Objects": objects, "Quiet": True}, indent=1))
            commands.append(
                shlex.join(
                    [
                        "aws",
                        "s3api",
                        "delete-objects",
                        "--bucket",
                        self.store.bucket,
                        "--delete",
                        f"file://{batch}",
                    ]
                )
            )
        (folder / "keys.txt").write_text("".join(f"{k}\n" for k in keys), encoding="utf-8")
        script = [
            "#!/bin/sh",
            f"# {len(keys)} sources `aegis migrate run` copied and verified, and kept: the",
            f"# storage-tools role may not delete them. Run as {BREAK_GLASS} (with MFA).",
            "set -e",
            *commands,
        ]
        (folder / "commands.sh").write_text("\n".join(script) + "\n", encoding="utf-8")
        summary.handover = str(folder)
        log.warning("migration_sources_kept", kept=len(keys), handover=str(folder))
        return str(folder)

    async def _purge(self, deleted: list[str], the_plan: Plan, summary: Summary) -> None:
        """Delete, by version id, every version and delete marker of the sources deleted by this
        run (and of those a purging run left pending in the journal). Object versions first;
        a key's delete markers only once all its versions are gone, so a failure never brings an
        old version back. A key whose latest version is an object (written again after the
        move) keeps all its versions, and so does one whose newest version is not the one moved
        (written and deleted again since)."""
        figures = summary.purged = PurgeFigures()
        dests = {p.move.dest for p in the_plan.items}
        moved = {p.move.source: p.source.etag for p in the_plan.items}  # the version moved
        for key in self.journal.purge_pending():  # moved by an earlier run: as it recorded
            moved.setdefault(key, str(self.journal.objects[key]["purge"].get("etag", "")))
        candidates = []
        for key in sorted(set(deleted) | set(self.journal.purge_pending())):
            if key in dests or not _purgeable(key, self.rules):
                figures.left += 1
                self.journal.purge(
                    key, "skipped", reason="under a target prefix, or not the role's"
                )
            else:
                candidates.append(key)
                self.journal.purge(key, PENDING, etag=moved[key])
        if not candidates:
            return
        self.journal.save()  # an interruption from here on is finished by the next purging run
        self.tracker.stage("versions", None)
        found = await _versions_of(self.store, self.rules, candidates)
        objects: dict[str, list[VersionInfo]] = {}
        markers: dict[str, list[VersionInfo]] = {}
        for key, versions in found.items():
            newest = next((v for v in versions if not v.delete_marker), None)
            if any(v.is_latest and not v.delete_marker for v in versions) or (
                newest is not None and newest.etag != moved[key]
            ):
                figures.left += 1
                self.journal.purge(key, "skipped", reason="an object was written there again")
                continue
            objects[key] = [v for v in versions if not v.delete_marker]
            markers[key] = [v for v in versions if v.delete_marker]
        doomed = [v for vs in objects.values() for v in vs]
        self.tracker.stage("purge", len(doomed) + sum(len(m) for m in markers.values()))
        failed = set(await self.store.delete_versions([(v.key, v.version_id) for v in doomed]))
        self.tracker.advance(len(doomed))
        broken = {key for key, _ in failed}
        last = [v for k, ms in markers.items() if k not in broken for v in ms]
        failed |= set(await self.store.delete_versions([(v.key, v.version_id) for v in last]))
        self.tracker.advance(len(last))
        broken |= {key for key, _ in failed}
        for key, ms in markers.items():
            if key in broken:
                summary.failed += 1
                self.journal.purge(key, PENDING, error="DeleteObjects reported an error")
                continue
            gone = objects[key]
            size = sum(v.size_bytes for v in gone)
            figures.keys += bool(gone or ms)
            figures.versions += len(gone)
            figures.bytes += size
            figures.markers += len(ms)
            self.journal.purge(key, "done", versions=len(gone), bytes=size, markers=len(ms))


def _parent(key: str) -> str:
    return key.rsplit("/", 1)[0] + "/" if "/" in key else ""
