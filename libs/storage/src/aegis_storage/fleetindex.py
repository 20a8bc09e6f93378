"""The fleet index's backfill: giving the index keys to items written before the index existed.

A table made without the index (by a version before it) holds FACTORY LATEST items and firing
alert states that lack ``fleet_pk``/``fleet_sk``, so listing the fleet misses them. The writers
of those items backfill them, each under its own role: the processor its FACTORY LATEST items,
the alert dispatcher its firing alert states. Not the bootstrap role: an UpdateItem whose
condition fails returns the whole item when it asks for ``ReturnValuesOnConditionCheckFailure:
ALL_OLD``, and no IAM condition key covers that parameter, so a role that may update an item must
also be one that may read it.

What is asked and what is done are recorded apart: ``aegis bootstrap`` (which may read and set the
table's tags, not its items) asks for a backfill by raising the table tag
``aegis:fleet-index-generation`` when it adds the index to an existing table, or when told to
again (``--reindex``, after a rollout in which writers of the previous version kept writing).
Each family's writer records the generation it has done in a marker item of its own
(``CLAIM#index-{family}`` / ``BACKFILL``) and backfills when the table asks for more. A new table
asks for nothing: it is made with the index.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from aegis_contracts import keys
from aegis_contracts.times import Clock, format_ts
from aegis_storage.encoding import indexed
from aegis_storage.errors import StorageError, translated

log = logging.getLogger(__name__)

GENERATION_TAG = "aegis:fleet-index-generation"
MARKER_SK = "BACKFILL"
# what the backfill's scan may name (the writers' roles allow their Scan of these and no other
# attribute: deploy/infra/policies)
SCAN_ATTRIBUTES = ("pk", "sk", "firing", keys.FLEET_PK)


@dataclass(frozen=True, slots=True)
class Family:
    """Items of one writer that belong in the index: ``condition`` picks them in the scan's
    filter (``:prefix`` is bound to ``prefix``) and, on the update, re-checks that the item is
    still one (a writer racing with the backfill wins)."""

    name: str
    prefix: str
    scan_filter: str
    values: tuple[tuple[str, dict[str, Any]], ...]
    update_condition: str

    @property
    def marker_pk(self) -> str:
        return keys.claim_pk(f"index-{self.name}")


FACTORIES = Family(
    name="factory",
    prefix="FACTORY#",
    scan_filter="sk = :latest AND begins_with(pk, :prefix)",
    values=((":latest", {"S": keys.LATEST_SK}),),
    update_condition="attribute_exists(pk)",
)
FIRING_ALERTS = Family(
    name="alert",
    prefix="ALERT#",
    scan_filter="begins_with(pk, :prefix) AND firing = :true",
    values=((":true", {"BOOL": True}),),
    update_condition="attribute_exists(pk) AND firing = :true",
)
FAMILIES = (FACTORIES, FIRING_ALERTS)


async def _table_arn(ddb: Any, table: str) -> str:
    with translated(f"describe table {table}"):
        return str((await ddb.describe_table(TableName=table))["Table"]["TableArn"])


async def wanted_generation(ddb: Any, table: str, arn: str | None = None) -> int:
    """The backfill generation the table asks for (0: none, the table was made with the index)."""
    arn = arn or await _table_arn(ddb, table)
    with translated(f"tags of {table}"):
        tags = (await ddb.list_tags_of_resource(ResourceArn=arn)).get("Tags", [])
    for tag in tags:
        if tag.get("Key") == GENERATION_TAG:
            try:
                return int(tag.get("Value", "0"))
            except ValueError as exc:
                raise StorageError(
                    f"table {table} has tag {GENERATION_TAG}={tag.get('Value')!r}, not a number; "
                    "set it to the last generation asked for (or delete it) and run "
                    "`aegis bootstrap --reindex`"
                ) from exc
    return 0


async def ask_for_backfill(ddb: Any, table: str, arn: str) -> int:
    """Raise the table's generation by one (bootstrap's side); returns the new one."""
    generation = await wanted_generation(ddb, table, arn) + 1
    with translated(f"tag {table}"):
        await ddb.tag_resource(
            ResourceArn=arn, Tags=[{"Key": GENERATION_TAG, "Value": str(generation)}]
        )
    return generation


async def done_generation(ddb: Any, table: str, family: Family) -> int:
    with translated(f"backfill marker of {family.name} in {table}"):
        got = await ddb.get_item(
            TableName=table,
            Key={"pk": {"S": family.marker_pk}, "sk": {"S": MARKER_SK}},
            ConsistentRead=True,
        )
    item = got.get("Item")
    return int(item["generation"]["N"]) if item else 0


async def backfill(ddb: Any, table: str, family: Family) -> int:
    """Give the index keys to every item of ``family`` that lacks them: one scan of the whole
    table naming only pk, sk, firing and fleet_pk (``Select: SPECIFIC_ATTRIBUTES``), and one
    conditional UpdateItem of the two index keys per item found. Returns how many were updated."""
    added = 0
    paginator = ddb.get_paginator("scan")
    values = {":prefix": {"S": family.prefix}, **dict(family.values)}
    with translated(f"backfill index {keys.FLEET_INDEX} of {table} ({family.name})"):
        async for page in paginator.paginate(
            TableName=table,
            FilterExpression=f"attribute_not_exists(#ipk) AND {family.scan_filter}",
            ExpressionAttributeNames={"#ipk": keys.FLEET_PK},
            ExpressionAttributeValues=values,
            ProjectionExpression="pk, sk, firing",
            Select="SPECIFIC_ATTRIBUTES",
        ):
            for item in page.get("Items", []):
                index = {k: v for k, v in indexed(item).items() if k in keys.FLEET_ATTRIBUTES}
                if not index:
                    continue
                update_values: dict[str, Any] = {
                    ":ipk": index[keys.FLEET_PK],
                    ":isk": index[keys.FLEET_SK],
                }
                if ":true" in family.update_condition:
                    update_values[":true"] = {"BOOL": True}
                try:
                    await ddb.update_item(
                        TableName=table,
                        Key={"pk": item["pk"], "sk": item["sk"]},
                        UpdateExpression="SET #ipk = :ipk, #isk = :isk",
                        ConditionExpression=family.update_condition,
                        ExpressionAttributeNames={"#ipk": keys.FLEET_PK, "#isk": keys.FLEET_SK},
                        ExpressionAttributeValues=update_values,
                        ReturnValues="NONE",
                    )
                except ddb.exceptions.ConditionalCheckFailedException:
                    continue  # deleted or resolved meanwhile: it belongs out of the index
                added += 1
    return added


@dataclass(frozen=True, slots=True)
class Backfilled:
    family: str
    generation: int
    items: int


async def backfill_if_asked(
    ddb: Any, table: str, family: Family, *, now: datetime
) -> Backfilled | None:
    """Backfill ``family`` when the table asks for a generation its marker has not done, then
    record it. None when there was nothing to do. Two replicas doing it at once both scan: the
    updates are idempotent, so the second only costs its reads."""
    wanted = await wanted_generation(ddb, table)
    if wanted == 0 or wanted <= await done_generation(ddb, table, family):
        return None
    items = await backfill(ddb, table, family)
    with translated(f"backfill marker of {family.name} in {table}"):
        await ddb.put_item(
            TableName=table,
            Item={
                "pk": {"S": family.marker_pk},
                "sk": {"S": MARKER_SK},
                "generation": {"N": str(wanted)},
                "items": {"N": str(items)},
                "at": {"S": format_ts(now)},
            },
        )
    return Backfilled(family.name, wanted, items)


@dataclass(slots=True)
class IndexBackfill:
    """A service's background task: check at start and every ``interval`` whether the table asks
    for a backfill of ``family``, and do it. Errors are logged and tried again next time."""

    ddb: Any
    table: str
    family: Family
    clock: Clock
    interval: timedelta

    async def check(self) -> Backfilled | None:
        try:
            done = await backfill_if_asked(self.ddb, self.table, self.family, now=self.clock())
        except StorageError as exc:
            log.warning("fleet_index_backfill_failed family=%s error=%s", self.family.name, exc)
            return None
        if done is not None:
            log.info(
                "fleet_index_backfilled family=%s generation=%d items=%d",
                done.family,
                done.generation,
                done.items,
            )
        return done

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.check()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval.total_seconds())
