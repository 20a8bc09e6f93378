"""``make bench``: the fleet at 1,000 factories, what it costs in storage requests: every figure
from the requests counted at the emulator (:mod:`aegis_devstack.testing.emulator`), never assumed.
One run, one private emulator, one private NATS; the platform's own code does the work (the read
model, the processor and its refresh, the aggregator, the cloud collectors, the dashboard API as
its own process):

1. seed ``--factories`` factories of production-shaped items with BatchWriteItem (25 items a
   request, 16 in flight, attributes through ``indexed()``): a full LATEST, HISTORY#STATE
   snapshots (the first of ``--depths`` per factory), 48 GRAPH#5M items, alert states (a firing
   CRITICAL for 10 % of the factories; resolved ones, an OBSERVATION and a CURSOR for all), 24 h
   of the aggregator's claims; and a production-shaped bucket for today (one object in each of a
   factory's folders; 60 messages' processed records in the aggregated window for 100 factories);
2. listing cost at both depths (HISTORY added up to the second in between): the fleet
   (``factory_latest_items``), the firing alerts (``firing_alerts``) and ``fleet_ids`` from the
   fleet index, against the old path, a filtered Scan of the whole table: requests by operation,
   index entries and table items read, items returned, item bytes and read units, seconds;
3. one refresh tick (``Refresher.tick``) on a fresh fleet (nothing to write) and one on a fleet
   where every factory is due (HISTORY, LATEST, a state_snapshot object and events each);
4. the dashboard API: ``GET /api/fleet`` p50/p95/p99, then its own storage requests per second
   with no screen and with ``--screens`` ``/api/live`` streams open (the page polls nothing);
5. requests and units per message: ``--messages`` factory_state messages archived as ingest
   does (the raw put) and handled by the processor in this process;
6. background ticks: an aggregator window (100 factories, scaled x10), a fast and a slow cloud
   collector run (at the first depth: the slow one reads every factory's last hour of HISTORY),
   the quiet refresh tick, the dashboard per hour and per screen-hour;
7. the cost per day of 1,000 factories at one message per 5 s, at AWS list prices (below), and
   the same with every listing the old Scan at a production depth (extrapolated).

Events the platform would publish are counted by a stand-in, not sent. Read and write units are
computed from the items in the requests and answers (AWS's item-size rules) by hooks on this
process's clients. The emulator is moto_server with the platform's patches
(``aegis_devstack.motoserver``: one request at a time, every request counted) and bench-only fast
paths (``accelerate_moto``) that change no answer and no count, only moto's time per request,
which otherwise grows with the whole table. The seed goes as signed HTTP requests with plain
JSON bodies (the SDK's serializer would be the bottleneck, not the emulator). Seconds are this
emulator's, not AWS's. Prints a table, writes JSON (``--out``); about 8 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import copy
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).parent))

import httpx
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from dashboard import TOKEN, wait_ready
from dashboard import latest as dashboard_latest
from dashboard import measure as fleet_latencies
from procstat import sample as process_sample

from aegis_aggregator.aggregate import JOB as AGGREGATOR_JOB
from aegis_aggregator.aggregate import Aggregator
from aegis_aggregator.stats import window_stats
from aegis_cloud_collector.app import create_app as create_collector_app
from aegis_cloud_collector.settings import CollectorSettings
from aegis_contracts import keys
from aegis_contracts.archive import Archive, admit
from aegis_contracts.ids import topic_for
from aegis_contracts.items import (
    AlertCursor,
    AlertObservation,
    AlertState,
    FactoryLatest,
    Graph5m,
    HistoryState,
)
from aegis_contracts.keys import Dataset
from aegis_contracts.state import FactoryState, RecordMeta, RiskRecord
from aegis_contracts.times import floor_to, format_ts, parse_ts, truncate_ms
from aegis_contracts.ttl import TtlSettings, expires_at
from aegis_devstack.localservers import (
    ManagedServer,
    free_port,
    start_managed_server,
    start_private_nats,
)
from aegis_devstack.testing.emulator import RequestCounts, request_counts
from aegis_processor import domain
from aegis_processor.handlers import Processor
from aegis_processor.refresh import Refresher
from aegis_processor.rules import RiskRules, load_rules
from aegis_processor.settings import ProcessorSettings
from aegis_runtime import logging as aegis_logging
from aegis_runtime.lifecycle import service_runner
from aegis_runtime.process import exit_process
from aegis_storage.bootstrap import bootstrap
from aegis_storage.clients import AwsClients, AwsConfig, open_clients
from aegis_storage.encoding import encode, indexed, to_attributes, to_plain
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

_T = TypeVar("_T")

# -- prices: us-east-1 list prices, on-demand, 2026; other regions differ ----------------------
PRICE_REGION_NOTE = "us-east-1 list prices, on-demand, 2026; other regions differ"
DDB_WRITE_PER_MILLION_WRU = 0.625
DDB_READ_PER_MILLION_RRU = 0.125
S3_PUT_PER_THOUSAND = 0.005  # PUT, COPY, POST, LIST
S3_GET_PER_THOUSAND = 0.0004  # GET and every other request

MESSAGE_INTERVAL_S = 5.0  # one factory_state per factory every 5 s
MESSAGES_PER_FACTORY_DAY = int(86_400 / MESSAGE_INTERVAL_S)  # 17,280
REFRESH_PER_DAY = 1440  # every 60 s
AGGREGATOR_WINDOWS_PER_DAY = 288  # every 5 min
FAST_RUNS_PER_DAY = 1440  # every 60 s
SLOW_RUNS_PER_DAY = 288  # every 300 s
PRODUCTION_ITEMS_PER_FACTORY = 2000  # the old Scan's table at production depth
AGGREGATOR_AFTER = timedelta(seconds=130)  # the aggregator's clock: the seed's now + this
PRODUCTION_HISTORY_PER_HOUR = 720  # HISTORY#STATE of one factory in an hour at one per 5 s
AGGREGATOR_SAMPLE = 100  # factories in the measured aggregator window (scaled to the fleet)
BATCH_WRITE = 25
WRITES_IN_FLIGHT = 16
GRAPH_ITEMS = 48
HISTORY_STEP = timedelta(seconds=5)
FIRING_SHARE = 10  # one factory in ten has a firing CRITICAL alert
SCRIPTS = Path(sys.executable).parent
TARGET_SEED_S = 120.0
TARGET_RATIO = 1.1
TARGET_REFRESH_S = 10.0
S3_PUT_OPS = frozenset(
    {"PutObject", "CopyObject", "CompleteMultipartUpload", "UploadPart", "CreateMultipartUpload"}
)
S3_LIST_OPS = frozenset(
    {"ListObjectsV2", "ListObjects", "ListObjectVersions", "ListMultipartUploads", "ListBuckets"}
)
DDB_WRITE_OPS = ("PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem")
LISTING_OPS = ("Query@fleet", "BatchGetItem")  # used by the fleet listings only
START = time.perf_counter()


async def counted(url: str) -> RequestCounts:
    """The emulator's counts. Its counter answers under the same lock as every request, so it
    waits behind a busy emulator: a long timeout, not the client's default 5 s."""
    return await asyncio.to_thread(request_counts, url, timeout=600)


def progress(text: str) -> None:
    print(f"[{time.perf_counter() - START:6.1f}s] {text}", flush=True)


# ---------------------------------------------------------------------------------------------
# The emulator: aegis_devstack.motoserver, with fast paths for moto's Query and Scan


def accelerate_moto() -> None:
    """Bench-only fast paths in this (emulator) process: the same answers to this bench's
    requests, the same counts, only moto's time per request.

    moto answers every Query by sorting every item of the table, and every Scan page by sorting
    them again and walking from the first item to the ExclusiveStartKey; it deep-copies every
    item it reads, sizes an item by rebuilding it (again at every attribute it stores), walks
    every attribute value of a request and an answer through the service model, keeps a stream
    record (two full images) per write and walks every key of a bucket for an S3 listing. At a
    quarter of a million items a request took seconds, which AWS's per-partition reads never
    do. Here:

    - a base-table Query sees only its partition's items, an index Query only the items that
      carry the index's hash key, a Scan page starts after its ExclusiveStartKey in a sorted
      list kept until the next write; moto's own code then filters, pages and sizes them exactly
      as before (every item it is not shown it would have skipped by those very checks);
    - items are read without the copy (moto's readers build new items to project; nothing
      changes what it reads); a KEYS_ONLY index entry is built from the keys alone;
    - an item is sized once, with moto's own rules, when stored (again after an UpdateItem);
    - a write's body is read, and a read's items written, as the JSON they are (what the
      model-driven parser and serializer give for items without binaries);
    - an S3 listing with a prefix walks the keys under it (sorted names, kept until a write);
    - no stream records are kept (nothing here reads the stream).

    Checked against the stock emulator: the same answers, pages and counted bytes."""
    from moto.dynamodb.exceptions import ItemSizeTooLarge  # noqa: PLC0415
    from moto.dynamodb.models import DynamoDBBackend  # noqa: PLC0415
    from moto.dynamodb.models import table as table_module  # noqa: PLC0415
    from moto.dynamodb.models.dynamo_type import DynamoType, Item, LimitedSizeDict  # noqa: PLC0415
    from moto.dynamodb.models.table import SecondaryIndex, StreamShard, Table  # noqa: PLC0415
    from moto.dynamodb.models.utilities import bytesize  # noqa: PLC0415
    from moto.dynamodb.responses import DynamoHandler, DynamoResult  # noqa: PLC0415
    from moto.s3.models import S3Backend  # noqa: PLC0415

    state = {"version": 0, "epoch": 0}
    cache: dict[tuple[int, str], tuple[int, Any]] = {}

    def raw_size(value: Mapping[str, Any]) -> int:
        """moto's DynamoType(value).size(), from the attribute value as it arrived."""
        ((kind, v),) = value.items()
        if kind == "N":
            return len(str(v))
        if kind in ("SS", "BS"):
            return sum(bytesize(e) for e in v)
        if kind == "NS":
            return sum(len(str(e)) for e in v)
        if kind == "L":
            return sum(raw_size(e) for e in v)
        if kind == "M":
            return sum(bytesize(k) + raw_size(e) for k, e in v.items())
        if isinstance(v, bool):  # BOOL, NULL
            return 1
        return bytesize(v)

    def bump(method: Callable[..., Any]) -> Callable[..., Any]:
        def changed(*args: Any, **kwargs: Any) -> Any:
            state["version"] += 1
            try:
                return method(*args, **kwargs)
            finally:
                state["version"] += 1

        return changed

    Table.put_item = bump(Table.put_item)  # type: ignore[method-assign]
    Table.delete_item = bump(Table.delete_item)  # type: ignore[method-assign]
    update_item = bump(DynamoDBBackend.update_item)

    def updated(*args: Any, **kwargs: Any) -> Any:
        try:
            item = update_item(*args, **kwargs)
        except BaseException:
            state["epoch"] += 1  # whatever it changed is sized again
            raise
        if item is not None:
            item.__dict__.pop("_bench_size", None)  # changed in place: sized again
        return item

    DynamoDBBackend.update_item = updated  # type: ignore[method-assign]

    def item_init(self: Any, hash_key: Any, range_key: Any, attrs: dict[str, Any]) -> None:
        # the 400 KB check once for the whole item, not again at every attribute (the sizes only
        # add up, so the whole item is the largest it gets)
        self.hash_key, self.range_key = hash_key, range_key
        raw = all(isinstance(v, dict) for v in attrs.values())
        values = {key: DynamoType(value) for key, value in attrs.items()}
        if raw:
            size = sum(bytesize(k) + raw_size(v) for k, v in attrs.items())
        else:
            size = sum(bytesize(k) + v.size() for k, v in values.items())
        if size > 405000:
            raise ItemSizeTooLarge
        self.attrs = LimitedSizeDict(values)
        self._bench_size = (state["epoch"], size)

    item_size_of = Item.size

    def sized(self: Any) -> int:
        known = self.__dict__.get("_bench_size")
        if known is not None and known[0] == state["epoch"]:
            return int(known[1])
        size = item_size_of(self)
        self._bench_size = (state["epoch"], size)
        return int(size)

    Item.__init__ = item_init  # type: ignore[method-assign]
    Item.size = sized  # type: ignore[method-assign]
    StreamShard.add = lambda self, old, new: None  # type: ignore[method-assign]

    project = SecondaryIndex.project

    def keys_only(self: Any, item: Any) -> Any:
        if (self.projection or {}).get("ProjectionType") != "KEYS_ONLY":
            return project(self, item)
        names = self.table_key_attrs + [key["AttributeName"] for key in self.schema]
        kept = {n: item.attrs[n] for n in names if n in item.attrs}
        if any(v.type not in ("S", "N") for v in kept.values()):
            return project(self, item)
        return Item(item.hash_key, item.range_key, {n: v.to_json() for n, v in kept.items()})

    SecondaryIndex.project = keys_only  # type: ignore[method-assign]

    def cached(table: Any, name: str, build: Callable[[], _T]) -> _T:
        hit = cache.get((id(table), name))
        if hit is not None and hit[0] == state["version"]:
            return hit[1]  # type: ignore[no-any-return]
        value = build()
        cache[(id(table), name)] = (state["version"], value)
        return value

    def every(table: Any) -> list[Any]:
        return [item for part in table.items.values() for item in part.values()]

    @contextlib.contextmanager
    def shown(table: Any, items: Callable[[], list[Any]]) -> Iterator[None]:
        copying = table_module.copy
        table.all_items = items
        table_module.copy = _NoCopy
        try:
            yield
        finally:
            table_module.copy = copying
            del table.all_items

    query, scan = Table.query, Table.scan

    def fast_query(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.range_key_attr:
            return query(self, *args, **kwargs)
        hash_key = args[0] if args else kwargs.get("hash_key")
        index_name = args[7] if len(args) > 7 else kwargs.get("index_name")
        if index_name:
            index = self.get_index(index_name)
            names = [k["AttributeName"] for k in index.schema if k["KeyType"] == "HASH"]

            def holders() -> list[Any]:
                return [i for i in every(self) if all(n in i.attrs for n in names)]

            found = cached(self, f"index:{index_name}", holders)
        else:
            found = list((self.items.get(hash_key) or {}).values())
        with shown(self, lambda: list(found)):
            return query(self, *args, **kwargs)

    def fast_scan(self: Any, *args: Any, **kwargs: Any) -> Any:
        index_name = args[4] if len(args) > 4 else kwargs.get("index_name")
        if index_name or self.hash_key_type != "S" or self.range_key_type != "S":
            return scan(self, *args, **kwargs)

        def ordered() -> tuple[list[Any], list[tuple[str, str]]]:
            items = sorted(every(self), key=lambda i: (i.hash_key.value, i.range_key.value))
            return items, [(i.hash_key.value, i.range_key.value) for i in items]

        items, order = cached(self, "sorted", ordered)
        args_list = list(args)
        start_key = args_list[2] if len(args_list) > 2 else kwargs.get("exclusive_start_key")
        first = 0
        if start_key:
            mark = (start_key[self.hash_key_attr]["S"], start_key[self.range_key_attr]["S"])
            first = bisect.bisect_right(order, mark)  # the items after the start key
            if len(args_list) > 2:
                args_list[2] = None
            else:
                kwargs["exclusive_start_key"] = None
        with shown(self, lambda: items[first:]):
            return scan(self, *args_list, **kwargs)

    Table.query = fast_query  # type: ignore[method-assign]
    Table.scan = fast_scan  # type: ignore[method-assign]

    # S3: a listing with a prefix walks the bucket's keys that start with it (a sorted list of
    # the names, kept until the next write), not every key of the bucket
    writes = {"version": 0}
    for name in (
        "put_object",
        "delete_object",
        "delete_objects",
        "copy_object",
        "complete_multipart_upload",
        "delete_bucket",
    ):
        method = getattr(S3Backend, name)

        def counted(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
            writes["version"] += 1
            try:
                return _method(*args, **kwargs)
            finally:
                writes["version"] += 1

        setattr(S3Backend, name, counted)
    names_of: dict[int, tuple[int, list[str]]] = {}
    list_objects = S3Backend.list_objects

    def listed(self: Any, bucket: Any, prefix: Any, *args: Any, **kwargs: Any) -> Any:
        store = getattr(bucket, "keys", None)
        if not prefix or not isinstance(store, dict):
            return list_objects(self, bucket, prefix, *args, **kwargs)
        known = names_of.get(id(bucket))
        if known is None or known[0] != writes["version"]:
            known = (writes["version"], sorted(dict.keys(store)))
            names_of[id(bucket)] = known
        names = known[1]
        first = bisect.bisect_left(names, prefix)
        last = first
        while last < len(names) and names[last].startswith(prefix):
            last += 1
        bucket.keys = _Prefixed([(n, store[n]) for n in names[first:last]])
        try:
            return list_objects(self, bucket, prefix, *args, **kwargs)
        finally:
            bucket.keys = store

    S3Backend.list_objects = listed  # type: ignore[method-assign]

    parse_parameters = DynamoHandler.parse_parameters

    def parsed_writes(self: Any, request: Any) -> None:
        # a write's body is plain JSON: read it as such, unless it holds a binary (base64, which
        # the model-driven parser decodes)
        body = request.data
        if self._get_action() in ("BatchWriteItem", "PutItem") and not _BINARY.search(body):
            self.params = json.loads(body)
            return
        parse_parameters(self, request)

    DynamoHandler.parse_parameters = parsed_writes  # type: ignore[method-assign]

    execute_result = DynamoResult.execute_result

    def plain_result(self: Any, context: Any) -> Any:
        # the items of a read's answer are plain DynamoDB JSON already: the model-driven
        # serializer writes the answer around them (an empty stand-in), the items go in as they
        # are (what it would have written for them, without walking every attribute value
        # through the service model); binaries and the like go the usual way
        big = _READ_PAYLOADS.get(context.operation_model.name)
        result = self.result
        if big is None or not isinstance(result, dict) or big not in result:
            return execute_result(self, context)
        payload = result[big]
        if big == "Responses":
            stand_in: Any = {table: [] for table in payload}
        else:
            stand_in = [] if big == "Items" else {}
        self._result = {**result, big: stand_in}
        try:
            status, headers, body = execute_result(self, context)
        finally:
            self._result = result
        answer = json.loads(body)
        answer[big] = payload
        try:
            return status, headers, json.dumps(answer)
        except TypeError:
            return execute_result(self, context)

    DynamoResult.execute_result = plain_result  # type: ignore[method-assign]


_BINARY = re.compile(rb'"B"|"BS"')
_READ_PAYLOADS = {"Query": "Items", "Scan": "Items", "GetItem": "Item", "BatchGetItem": "Responses"}


class _Prefixed:
    """A bucket's keys as moto's listing reads them (``items()``), those under one prefix."""

    def __init__(self, items: list[tuple[str, Any]]) -> None:
        self._items = items

    def items(self) -> list[tuple[str, Any]]:
        return self._items


class _NoCopy:
    """``copy`` for moto's reads: the items it reads are only read (projections build new)."""

    @staticmethod
    def deepcopy(value: _T) -> _T:
        return value


def serve_emulator(port: int) -> None:
    """The emulator process: the platform's moto_server (aegis_devstack.motoserver), faster."""
    from aegis_devstack import motoserver  # noqa: PLC0415

    accelerate_moto()
    motoserver.main(["-H", "127.0.0.1", "-p", str(port)])


def start_emulator(scratch: Path) -> ManagedServer:
    port = free_port()
    command = [sys.executable, str(Path(__file__).resolve()), "--serve-emulator", str(port)]
    return start_managed_server(f"http://127.0.0.1:{port}", command, scratch / "moto.log")


# ---------------------------------------------------------------------------------------------
# Item sizes (AWS's rules) and the units they cost


def value_size(value: Mapping[str, Any]) -> int:
    """Bytes of one DynamoDB attribute value: strings and binaries by length, numbers one byte
    per two significant digits plus one, booleans and null one, lists and maps 3 bytes plus one
    per element (and a map's key names), sets the sum of their elements."""
    ((kind, v),) = value.items()
    if kind == "S":
        return len(str(v).encode())
    if kind == "N":
        return number_size(str(v))
    if kind == "B":
        return len(v)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "L":
        return 3 + sum(1 + value_size(e) for e in v)
    if kind == "M":
        return 3 + sum(len(k.encode()) + 1 + value_size(e) for k, e in v.items())
    if kind == "SS":
        return sum(len(s.encode()) for s in v)
    if kind == "NS":
        return sum(number_size(str(n)) for n in v)
    if kind == "BS":
        return sum(len(b) for b in v)
    return len(json.dumps(v))


def number_size(text: str) -> int:
    digits = text.lstrip("-").replace(".", "").split("e")[0].split("E")[0].strip("0") or "0"
    return (len(digits) + 1) // 2 + 1


def item_size(attributes: Mapping[str, Any]) -> int:
    """An item's size as DynamoDB counts it: attribute names plus values."""
    return sum(len(name.encode()) + value_size(value) for name, value in attributes.items())


def write_units(size: int) -> int:
    return max(1, math.ceil(size / 1024))


def read_units(size: int, *, consistent: bool) -> float:
    return max(1, math.ceil(size / 4096)) * (1.0 if consistent else 0.5)


@dataclass
class OpUnits:
    requests: int = 0
    items: int = 0  # written (writes) or returned (reads)
    wru: float = 0.0
    rru: float = 0.0
    bytes_read: int = 0  # item bytes read (AWS sizes; estimated for items a Scan filtered out)
    bytes_written: int = 0

    def add(self, other: OpUnits, sign: int = 1) -> None:
        self.requests += sign * other.requests
        self.items += sign * other.items
        self.wru += sign * other.wru
        self.rru += sign * other.rru
        self.bytes_read += sign * other.bytes_read
        self.bytes_written += sign * other.bytes_written


_FAMILIES = {"HISTORY": keys.HISTORY_STATE_PREFIX, "GRAPH": keys.GRAPH_5M_PREFIX}


class Meter:
    """Units of every DynamoDB request of one client, from its parameters and answers
    (botocore's before-parameter-build and after-call events). An UpdateItem's size is the
    stored item's after the update (:meth:`size_updates`), which its request does not carry."""

    def __init__(self) -> None:
        self.ops: dict[str, OpUnits] = defaultdict(OpUnits)
        # Query by the key family it reads (HISTORY, GRAPH, other): a part of ``ops["Query"]``
        self.detail: dict[str, OpUnits] = defaultdict(OpUnits)
        self.updates: list[tuple[str, dict[str, Any]]] = []
        self.unreturned_item_size = 0  # mean size of the items a filtered Scan did not return

    def attach(self, clients: AwsClients) -> None:
        """Meter both DynamoDB clients: aiobotocore's (the control plane and direct calls) and
        the read model's item client (its one ``call``, wrapped)."""
        clients.dynamodb.meta.events.register("before-parameter-build.dynamodb", self._before)
        clients.dynamodb.meta.events.register("after-call.dynamodb", self._after)
        items = clients.items
        unmetered = items.call

        async def metered(action: str, payload: Mapping[str, Any]) -> dict[str, Any]:
            call = self._record(self._name(action, payload), payload)
            parsed = await unmetered(action, payload)
            self._answered(call, parsed)
            return parsed

        items.call = metered  # type: ignore[method-assign]

    def detach(self, clients: AwsClients) -> None:
        clients.dynamodb.meta.events.unregister("before-parameter-build.dynamodb", self._before)
        clients.dynamodb.meta.events.unregister("after-call.dynamodb", self._after)
        vars(clients.items).pop("call", None)

    def snapshot(self, detail: bool = False) -> dict[str, OpUnits]:
        ops = self.detail if detail else self.ops
        return {op: copy.copy(units) for op, units in ops.items()}

    def since(self, earlier: Mapping[str, OpUnits], detail: bool = False) -> dict[str, OpUnits]:
        out: dict[str, OpUnits] = {}
        for op, units in (self.detail if detail else self.ops).items():
            delta = copy.copy(units)
            if op in earlier:
                delta.add(earlier[op], -1)
            if delta.requests:
                out[op] = delta
        return out

    @staticmethod
    def _name(name: str, params: Mapping[str, Any]) -> str:
        if name in ("Query", "Scan") and params.get("IndexName"):
            return f"{name}@{params['IndexName']}"
        return name

    def _before(self, params: Mapping[str, Any], model: Any, context: Any = None, **_: Any) -> None:
        call = self._record(self._name(str(model.name), params), params)
        if isinstance(context, dict):
            context["fleet_bench"] = call

    def _record(self, name: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """Count a request as it goes out; returns what :meth:`_answered` needs of it."""
        family = None
        if name == "Query":
            low = str(params.get("ExpressionAttributeValues", {}).get(":low", {}).get("S", ""))
            family = next((f for f, prefix in _FAMILIES.items() if low.startswith(prefix)), "other")
            self.detail[f"Query[{family}]"].requests += 1
        units = self.ops[name]
        units.requests += 1
        if name == "PutItem":
            size = item_size(params["Item"])
            units.items += 1
            units.wru += write_units(size)
            units.bytes_written += size
        elif name == "BatchWriteItem":
            for requests in params["RequestItems"].values():
                for request in requests:
                    units.items += 1
                    if "PutRequest" in request:
                        size = item_size(request["PutRequest"]["Item"])
                        units.wru += write_units(size)
                        units.bytes_written += size
                    else:
                        units.wru += 1  # a delete: the deleted item's size (small ones here)
        elif name == "DeleteItem":
            units.items += 1
            units.wru += 1
        elif name == "UpdateItem":
            units.items += 1
            self.updates.append((str(params["TableName"]), dict(params["Key"])))
        return {"op": name, "params": params, "family": family}

    def _after(self, parsed: Mapping[str, Any], model: Any, context: Any = None, **_: Any) -> None:
        call = context.get("fleet_bench") if isinstance(context, dict) else None
        if call and "Error" not in parsed:
            self._answered(call, parsed)

    def _answered(self, call: Mapping[str, Any], parsed: Mapping[str, Any]) -> None:
        """Count what a request read, from its answer."""
        name, params = call["op"], call["params"]
        units = self.ops[name]
        consistent = bool(params.get("ConsistentRead"))
        if name == "GetItem":
            size = item_size(parsed["Item"]) if parsed.get("Item") else 0
            units.items += 1 if parsed.get("Item") else 0
            units.rru += read_units(size, consistent=consistent)
            units.bytes_read += size
        elif name == "BatchGetItem":
            for table, items in (parsed.get("Responses") or {}).items():
                strong = bool(params["RequestItems"].get(table, {}).get("ConsistentRead"))
                for item in items:
                    size = item_size(item)
                    units.items += 1
                    units.rru += read_units(size, consistent=strong)
                    units.bytes_read += size
        elif name.startswith(("Query", "Scan")):
            items = parsed.get("Items") or []
            size = sum(item_size(i) for i in items)
            unreturned = int(parsed.get("ScannedCount", len(items))) - len(items)
            size += unreturned * self.unreturned_item_size
            # an index is read eventually consistently; a page costs its read bytes, rounded up
            strong = consistent and "@" not in name
            parts = [units]
            if call.get("family"):
                parts.append(self.detail[f"Query[{call['family']}]"])
            for part in parts:
                part.items += len(items)
                part.rru += read_units(size, consistent=strong)
                part.bytes_read += size

    def take_updates(self) -> list[tuple[str, dict[str, Any]]]:
        updates, self.updates = self.updates, []
        return updates

    async def size_updates(self, ddb: Any, updates: Sequence[tuple[str, dict[str, Any]]]) -> float:
        """The write units of UpdateItems: each updated item's size as stored now."""
        wru = 0.0
        for table, key in updates:
            resp = await ddb.get_item(TableName=table, Key=key, ConsistentRead=True)
            wru += write_units(item_size(resp.get("Item") or key))
        return wru


# ---------------------------------------------------------------------------------------------
# Measuring one piece of work


@dataclass
class Measured:
    label: str
    seconds: float
    counts: RequestCounts
    units: dict[str, OpUnits]
    result: Any = None
    detail: dict[str, OpUnits] = field(default_factory=dict)
    # CPU seconds meanwhile: the emulator's process, this one's (the platform's code, the meter)
    cpu: tuple[float, float] = (0.0, 0.0)

    def ddb(self) -> dict[str, int]:
        return self.counts.ops("dynamodb")

    def s3(self) -> dict[str, int]:
        return self.counts.ops("s3")

    def rru(self) -> float:
        return sum(u.rru for u in self.units.values())

    def wru(self) -> float:
        return sum(u.wru for u in self.units.values())

    def bytes_read(self) -> int:
        return sum(u.bytes_read for u in self.units.values())

    def ddb_write_requests(self) -> int:
        return sum(self.counts.count("dynamodb", op) for op in DDB_WRITE_OPS)

    def ddb_write_items(self) -> int:
        return sum(self.units[op].items for op in DDB_WRITE_OPS if op in self.units)

    def ddb_read_requests(self) -> int:
        return self.counts.total("dynamodb") - self.ddb_write_requests()

    def s3_tiers(self) -> dict[str, int]:
        return s3_tiers(self.s3())

    def summary(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 3),
            "emulator_cpu_s": round(self.cpu[0], 2),
            "bench_process_cpu_s": round(self.cpu[1], 2),
            "dynamodb": self.ddb(),
            "s3": self.s3(),
            "dynamodb_read_units": round(self.rru(), 2),
            "dynamodb_write_units": round(self.wru(), 2),
            "dynamodb_bytes_read": self.bytes_read(),
            "s3_by_price_tier": self.s3_tiers(),
        }


def s3_tiers(ops: Mapping[str, int]) -> dict[str, int]:
    tiers = {"put": 0, "list": 0, "get": 0}
    for op, n in ops.items():
        tier = "put" if op in S3_PUT_OPS else "list" if op in S3_LIST_OPS else "get"
        tiers[tier] += n
    return tiers


class Bench:
    def __init__(
        self, url: str, clients: AwsClients, meter: Meter, table: str, emulator_pid: int | None
    ) -> None:
        self.url, self.clients, self.meter, self.table = url, clients, meter, table
        self.emulator_pid = emulator_pid

    def _emulator_cpu(self) -> float:
        return 0.0 if self.emulator_pid is None else process_sample(self.emulator_pid).cpu_s

    async def measure(self, label: str, work: Callable[[], Awaitable[_T]]) -> Measured:
        """Run ``work``; what the emulator counted meanwhile and the units it cost."""
        before = await counted(self.url)
        units0 = self.meter.snapshot()
        detail0 = self.meter.snapshot(detail=True)
        self.meter.take_updates()
        emulator_cpu, own_cpu = self._emulator_cpu(), time.process_time()
        started = time.perf_counter()
        result = await work()
        seconds = time.perf_counter() - started
        cpu = (self._emulator_cpu() - emulator_cpu, time.process_time() - own_cpu)
        counts = await counted(self.url) - before
        units = self.meter.since(units0)
        detail = self.meter.since(detail0, detail=True)
        updates = self.meter.take_updates()
        if updates:  # sized after the counts were taken: these reads are not the work's
            units["UpdateItem"].wru += await self.meter.size_updates(self.clients.dynamodb, updates)
        return Measured(label, seconds, counts, units, result, detail, cpu)


# ---------------------------------------------------------------------------------------------
# Production-shaped items


def fid(i: int) -> str:
    return f"factory-{i:03d}"


@dataclass
class Fleet:
    """The seeded fleet: its clock, each factory's LATEST (encoded once), the seeded sizes."""

    now: datetime
    rules: RiskRules
    ttl: TtlSettings
    latest: list[Any]  # Encoded
    items: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    wru: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    depth: int = 0

    def count(self, family: str, attributes: Mapping[str, Any], size: int = 0) -> dict[str, Any]:
        """Note one item written (its size, its write units) and give its attributes with the
        fleet index's keys (``indexed``)."""
        size = size or item_size(attributes)
        self.items[family] += 1
        self.bytes[family] += size
        self.wru[family] += write_units(size)
        return indexed(attributes)

    @property
    def total_items(self) -> int:
        return sum(self.items.values())

    def mean_size(self, families: Iterable[str]) -> int:
        n = sum(self.items[f] for f in families)
        return round(sum(self.bytes[f] for f in families) / n) if n else 0


def make_fleet(factories: int, now: datetime, rules: RiskRules, ttl: TtlSettings) -> Fleet:
    """Each factory's LATEST: dashboard.py's full shape, with the risk and pipeline status the
    processor derives at ``now`` (so a refresh at ``now`` finds nothing to change)."""
    encoded = []
    for i in range(factories):
        base = dashboard_latest(i, now)
        base.pop("risk")
        base.pop("pipeline_status")
        view = FactoryLatest.model_validate(base)
        fresh = domain.derive(view, rules, now)
        state = view.model_copy(
            update={"risk": fresh.risk, "pipeline_status": fresh.pipeline_status}
        )
        encoded.append(encode(state, drop_none=True))
    return Fleet(now=now, rules=rules, ttl=ttl, latest=encoded)


def history_items(fleet: Fleet, i: int, depths: range) -> list[dict[str, Any]]:
    """HISTORY#STATE snapshots of factory ``i``, every 5 s back from ``now``: LATEST-sized
    (the LATEST with its sort key, ``updated_at``, ``prev_updated_at`` and ``ttl``)."""
    latest = fleet.latest[i]
    ttl = {"N": str(fleet.ttl.history_expiry(fleet.now))}
    out = []
    size = 0
    for d in depths:
        at = fleet.now - HISTORY_STEP * (d + 1)
        item = {
            **latest.attributes,
            "sk": {"S": keys.history_state_sk(at)},
            "updated_at": {"S": format_ts(at)},
            "prev_updated_at": {"S": format_ts(at - HISTORY_STEP)},
            "ttl": ttl,
        }
        size = size or item_size(item)  # the same for every snapshot of the factory
        out.append(fleet.count("history", item, size))
    return out


def graph_items(fleet: Fleet, i: int) -> list[dict[str, Any]]:
    """48 GRAPH#5M windows (4 h back) with the statistics of 12 LATEST-shaped snapshots: one
    item computed and encoded, the others the same with their window's times."""
    latest = fleet.latest[i]
    newest = floor_to(fleet.now, keys.GRAPH_BUCKET) - keys.GRAPH_BUCKET
    snaps = [
        HistoryState.model_validate(
            {**latest.plain, "updated_at": format_ts(newest + timedelta(seconds=25 * k)), "ttl": 1}
        )
        for k in range(12)
    ]
    stats = window_stats(snaps, newest, newest + keys.GRAPH_BUCKET)
    first = encode(
        Graph5m(
            pk=keys.factory_pk(fid(i)),
            sk=keys.graph_5m_sk(newest),
            factory_id=fid(i),
            bucket_start=newest,
            bucket_end=newest + keys.GRAPH_BUCKET,
            stats=stats,
            ttl=1,
        )
    ).attributes
    times = ("window_start", "window_end", "first_sample_at", "last_sample_at")
    out = []
    for g in range(GRAPH_ITEMS):
        start = newest - keys.GRAPH_BUCKET * g
        end = start + keys.GRAPH_BUCKET
        body = dict(first["stats"]["M"])
        for name in times:
            if name in body and "S" in body[name]:
                at = parse_ts(body[name]["S"]) - keys.GRAPH_BUCKET * g
                body[name] = {"S": format_ts(at)}
        ttl = expires_at(end, fleet.ttl.graph_bucket_ttl_hours * 3600)
        item = {
            **first,
            "sk": {"S": keys.graph_5m_sk(start)},
            "bucket_start": {"S": format_ts(start)},
            "bucket_end": {"S": format_ts(end)},
            "stats": {"M": body},
            "ttl": {"N": str(ttl)},
        }
        out.append(fleet.count("graph", item))
    return out


def alert_items(fleet: Fleet, i: int) -> list[dict[str, Any]]:
    """Alert states of factory ``i``: two resolved warnings, an observation, a cursor; and for
    one factory in ten a firing CRITICAL."""
    f, now = fid(i), fleet.now
    ttl = fleet.ttl.alert_expiry(now)
    pk = keys.alert_pk(f)
    models: list[Any] = [
        AlertState(
            pk=pk,
            sk=keys.alert_sk("WARNING", reason, "STATE"),
            scope=f,
            severity="WARNING",
            reason=reason,
            status="STATE",
            firing=False,
            version=4,
            fired_at=now - timedelta(hours=3),
            last_sent_at=now - timedelta(hours=3),
            last_snapshot_at=now - timedelta(hours=2),
            resolved_at=now - timedelta(hours=2),
            sent_count=2,
            ttl=ttl,
        )
        for reason in ("PPE_VIOLATION", "DATA_STALE")
    ]
    models.append(
        AlertObservation(
            pk=pk,
            sk=keys.observation_sk("WARNING", "CO_HIGH", "STATE"),
            scope=f,
            count=1,
            first_observed_at=now - timedelta(minutes=2),
            last_observed_at=now - timedelta(minutes=2),
            ttl=ttl,
        )
    )
    models.append(
        AlertCursor(
            pk=pk,
            sk=keys.alert_cursor_sk("STATE"),
            scope=f,
            status="STATE",
            last_snapshot_at=now,
            ttl=ttl,
        )
    )
    if i % FIRING_SHARE == 0:
        models.append(
            AlertState(
                pk=pk,
                sk=keys.alert_sk("CRITICAL", "CO_HIGH", "STATE"),
                scope=f,
                severity="CRITICAL",
                reason="CO_HIGH",
                status="STATE",
                firing=True,
                version=1,
                fired_at=now - timedelta(minutes=10),
                last_sent_at=now - timedelta(minutes=10),
                last_snapshot_at=now,
                sent_count=1,
                ttl=ttl,
            )
        )
    return [fleet.count("alert", encode(m, drop_none=True).attributes) for m in models]


class RawWriter:
    """Seeding as fast as the emulator allows: BatchWriteItem and PutObject as signed HTTP
    requests with JSON bodies written by ``json.dumps`` (botocore's serializer walks every
    attribute value through the service model: ~7 ms of this process's CPU per 25 items), 16 in
    flight. The same requests the SDK sends, counted by the emulator the same way."""

    def __init__(self, endpoint: str, region: str) -> None:
        self.endpoint, self.region = endpoint.rstrip("/"), region
        limits = httpx.Limits(max_connections=WRITES_IN_FLIGHT)
        self.http = httpx.AsyncClient(base_url=self.endpoint, limits=limits, timeout=600)
        self.credentials = Credentials("test", "test")
        self.slots = asyncio.Semaphore(WRITES_IN_FLIGHT)

    async def close(self) -> None:
        await self.http.aclose()

    def _signed(
        self, method: str, url: str, body: bytes, headers: dict[str, str], service: str
    ) -> dict[str, str]:
        request = AWSRequest(method=method, url=url, data=body, headers=headers)
        signer = S3SigV4Auth if service == "s3" else SigV4Auth
        signer(self.credentials, service, self.region).add_auth(request)
        return dict(request.headers.items())

    async def batch_write(self, table: str, items: Sequence[dict[str, Any]]) -> int:
        """BatchWriteItem, 25 items a request; unprocessed items again. Returns the requests."""

        async def one(chunk: Sequence[dict[str, Any]]) -> None:
            pending: list[dict[str, Any]] = [{"PutRequest": {"Item": item}} for item in chunk]
            for attempt in range(10):
                body = json.dumps({"RequestItems": {table: pending}}).encode()
                headers = self._signed(
                    "POST",
                    self.endpoint + "/",
                    body,
                    {
                        "X-Amz-Target": "DynamoDB_20120810.BatchWriteItem",
                        "Content-Type": "application/x-amz-json-1.0",
                    },
                    "dynamodb",
                )
                async with self.slots:
                    resp = await self.http.post("/", content=body, headers=headers)
                if resp.status_code != 200:
                    raise RuntimeError(
                        f"BatchWriteItem answered {resp.status_code}: {resp.text[:300]}"
                    )
                pending = list((resp.json().get("UnprocessedItems") or {}).get(table) or [])
                if not pending:
                    return
                await asyncio.sleep(0.05 * 2**attempt)
            raise RuntimeError(f"{len(pending)} items stayed unprocessed")

        chunks = [items[i : i + BATCH_WRITE] for i in range(0, len(items), BATCH_WRITE)]
        await asyncio.gather(*(one(c) for c in chunks))
        return len(chunks)

    async def put_objects(self, bucket: str, objects: Mapping[str, bytes]) -> int:
        """PutObject of each (key, body), path-style."""

        async def one(key: str, body: bytes) -> None:
            path = f"/{bucket}/{urllib.parse.quote(key, safe='/')}"
            headers = self._signed(
                "PUT", self.endpoint + path, body, {"Content-Type": "application/json"}, "s3"
            )
            async with self.slots:
                resp = await self.http.put(path, content=body, headers=headers)
            if resp.status_code != 200:
                raise RuntimeError(
                    f"PutObject {key} answered {resp.status_code}: {resp.text[:300]}"
                )

        await asyncio.gather(*(one(k, b) for k, b in objects.items()))
        return len(objects)


def claim_items(fleet: Fleet) -> list[dict[str, Any]]:
    """The aggregator's finished claims of the 24 h before its newest window: what its tick
    reads back every time in production."""
    at = fleet.now + AGGREGATOR_AFTER
    newest = floor_to(at - timedelta(seconds=15), keys.GRAPH_BUCKET) - keys.GRAPH_BUCKET
    out = []
    for k in range(1, int(timedelta(hours=24) / keys.GRAPH_BUCKET)):
        start = newest - keys.GRAPH_BUCKET * k
        done = start + keys.GRAPH_BUCKET + timedelta(seconds=16)
        item = {
            "pk": keys.claim_pk(AGGREGATOR_JOB),
            "sk": keys.claim_sk(start),
            "job": AGGREGATOR_JOB,
            "window_start": format_ts(start),
            "owner": "aggregator-bench",
            "claimed_at": format_ts(done),
            "ttl": expires_at(fleet.now, 3 * 86_400),
            "done_at": format_ts(done),
        }
        out.append(fleet.count("claim", to_attributes(to_plain(item))))
    return out


def window_of(now: datetime) -> datetime:
    """The aggregator window this bench runs: the last one completed before ``now``."""
    return floor_to(now, keys.GRAPH_BUCKET) - keys.GRAPH_BUCKET


def s3_objects(fleet: Fleet, factories: int, sample: int) -> tuple[dict[str, bytes], int]:
    """A production-shaped bucket for today. Every factory: one object in each folder the
    platform keeps for it (raw factory_state and infra_state, processed factory_state,
    risk_score, infra_state and state_snapshot, processed_agg metrics_5m), an hour before the
    aggregated window, so the slow collector's object count lists what it would list in
    production. The ``sample`` factories of the aggregator window: the processed records of 60
    factory_state messages (one per 5 s) in that window, as the processor writes them
    (factory_state and risk_score). Returns the objects and how many are window records."""
    window = window_of(fleet.now)
    tree_at = window - timedelta(hours=1)
    if tree_at.date() != window.date():
        tree_at = window + timedelta(hours=1)  # stay in the same UTC day (the count's)
    objects: dict[str, bytes] = {}
    for i in range(factories):
        f = fid(i)
        mid = f"{f}-tree-0001"
        for source in ("factory_state", "infra_state"):
            objects[keys.raw_key(f, source, tree_at, mid)] = b"{}"
        for dataset in (Dataset.FACTORY_STATE, Dataset.RISK_SCORE, Dataset.INFRA_STATE):
            objects[keys.processed_key(f, dataset, tree_at, mid)] = b"{}"
        objects[keys.state_snapshot_key(f, tree_at)] = b"{}"
        objects[keys.processed_agg_key(f, floor_to(tree_at, keys.GRAPH_BUCKET))] = b"{}"
    records = 0
    for i in range(sample):
        f = fid(i)
        state = dict(fleet.latest[i].plain["factory_state"])
        risk = domain.message_risk(FactoryState.model_validate(state), fleet.rules)
        for k in range(int(keys.GRAPH_BUCKET / HISTORY_STEP)):
            at = window + HISTORY_STEP * k + timedelta(seconds=2)
            mid = f"{f}-win-{k:04d}"
            meta = {
                **state["meta"],
                "message_id": mid,
                "emitted_at": format_ts(at),
                "event_time": format_ts(at),
                "received_at": format_ts(at + timedelta(milliseconds=200)),
                "raw_key": keys.raw_key(f, "factory_state", at, mid),
            }
            body = {**state, "meta": meta}
            record = RiskRecord(meta=RecordMeta.model_validate(meta), risk=risk)
            objects[keys.processed_key(f, Dataset.FACTORY_STATE, at, mid)] = json.dumps(
                body
            ).encode()
            objects[keys.processed_key(f, Dataset.RISK_SCORE, at, mid)] = (
                record.model_dump_json().encode()
            )
            records += 2
    return objects, records


async def seed(
    bench: Bench, writer: RawWriter, fleet: Fleet, factories: int, depth: int
) -> tuple[Measured, float, int]:
    """Every factory's items (built first; the time returned), then written. Returns the
    measurement, the build seconds and the write units (from the items' sizes)."""
    started = time.perf_counter()
    wru = sum(fleet.wru.values())
    items: list[dict[str, Any]] = []
    for i in range(factories):
        items.append(fleet.count("latest", fleet.latest[i].attributes))
        items.extend(history_items(fleet, i, range(depth)))
        items.extend(graph_items(fleet, i))
        items.extend(alert_items(fleet, i))
    items.extend(claim_items(fleet))
    fleet.depth = depth
    built = time.perf_counter() - started
    written = await bench.measure("seed", lambda: writer.batch_write(bench.table, items))
    written.result = len(items)
    return written, built, sum(fleet.wru.values()) - wru


async def deepen(
    bench: Bench, writer: RawWriter, fleet: Fleet, factories: int, depth: int
) -> tuple[Measured, int]:
    """HISTORY#STATE of every factory from the current depth to ``depth``."""
    wru = sum(fleet.wru.values())
    items: list[dict[str, Any]] = []
    for i in range(factories):
        items.extend(history_items(fleet, i, range(fleet.depth, depth)))
    fleet.depth = depth
    written = await bench.measure("deepen", lambda: writer.batch_write(bench.table, items))
    written.result = len(items)
    return written, sum(fleet.wru.values()) - wru


# ---------------------------------------------------------------------------------------------
# 2. Listings


async def scan_all(ddb: Any, table: str, condition: str, values: dict[str, Any]) -> list[Any]:
    """The old listing: a paginated Scan of the whole table with a filter."""
    found: list[Any] = []
    paginator = ddb.get_paginator("scan")
    async for page in paginator.paginate(
        TableName=table, FilterExpression=condition, ExpressionAttributeValues=values
    ):
        found.extend(page.get("Items", []))
    return found


OLD_FLEET = (
    "sk = :latest AND begins_with(pk, :factory)",
    {":latest": {"S": keys.LATEST_SK}, ":factory": {"S": "FACTORY#"}},
)
OLD_FIRING = (
    "begins_with(pk, :alert) AND firing = :true",
    {":alert": {"S": "ALERT#"}, ":true": {"BOOL": True}},
)


def listing_row(m: Measured, depth: int, listing: str, path: str) -> dict[str, Any]:
    returned = len(m.result)
    index_read = m.counts.items_scanned("Query@fleet")
    table_read = sum(m.counts.items_scanned(op) for op in m.ddb() if not op.startswith("Query@"))
    return {
        "depth": depth,
        "listing": listing,
        "path": path,
        "requests": m.ddb(),
        "index_entries_read": index_read,
        "table_items_read": table_read,
        "items_returned": returned,
        "table_read_per_returned": round(table_read / returned, 3) if returned else None,
        "index_read_per_returned": round(index_read / returned, 3) if returned else None,
        "bytes_returned": m.counts.bytes_returned(),
        "item_bytes_read": m.bytes_read(),
        "read_units": round(m.rru(), 2),
        "seconds": round(m.seconds, 3),
    }


async def listings(bench: Bench, fleet: Fleet, depth: int) -> list[dict[str, Any]]:
    rm = ReadModel(bench.clients.items, bench.table)
    ddb, table = bench.clients.dynamodb, bench.table
    now = fleet.now
    rows = []
    fleet_list = await bench.measure("fleet", rm.factory_latest_items)
    rows.append(listing_row(fleet_list, depth, "fleet", "index"))
    firing = await bench.measure("firing", lambda: rm.firing_alerts(now=now))
    rows.append(listing_row(firing, depth, "firing alerts", "index"))
    ids = await bench.measure("fleet_ids", rm.fleet_ids)
    rows.append(listing_row(ids, depth, "fleet_ids", "index"))
    old = await bench.measure("scan fleet", lambda: scan_all(ddb, table, *OLD_FLEET))
    rows.append(listing_row(old, depth, "fleet", "Scan"))
    old_firing = await bench.measure("scan firing", lambda: scan_all(ddb, table, *OLD_FIRING))
    rows.append(listing_row(old_firing, depth, "firing alerts", "Scan"))
    assert len(fleet_list.result) == len(old.result), "the index and the Scan disagree"
    assert len(firing.result) == len(old_firing.result), "the index and the Scan disagree"
    assert len(ids.result) == len(fleet_list.result)
    return rows


# ---------------------------------------------------------------------------------------------
# 3. Refresh, 5. messages, 6. background


class Published:
    """The stand-in for the broker: counts the events, sends nothing."""

    def __init__(self) -> None:
        self.events = 0

    async def many(self, events: Sequence[Any]) -> list[bool]:
        self.events += len(events)
        return [True] * len(events)

    async def one(self, subject: str, event: Any, *, msg_id: str) -> bool:
        del subject, event, msg_id
        self.events += 1
        return True


class FixedClock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def new_processor(
    bench: Bench, fleet: Fleet, bucket: str, clock: FixedClock, pub: Published
) -> Processor:
    return Processor(
        store=ObjectStore(bench.clients, bucket),
        readmodel=ReadModel(bench.clients.items, bench.table),
        publish=pub.many,
        rules=fleet.rules,
        ttl=fleet.ttl,
        clock=clock,
    )


async def refresh_tick(
    bench: Bench, processor: Processor, clock: FixedClock, label: str
) -> Measured:
    refresher = Refresher(
        processor,
        interval=timedelta(seconds=60),
        catchup=0,
        clock=clock,
        # the processor's default (AEGIS_REFRESH_CONCURRENCY)
        concurrency=ProcessorSettings.model_fields["refresh_concurrency"].default,
    )
    return await bench.measure(label, refresher.tick)


def factory_state_payload(factory: str, message_id: str, at: datetime, n: int) -> bytes:
    return json.dumps(
        {
            "message_id": message_id,
            "factory_id": factory,
            "device_id": "edge-01",
            "emitted_at": format_ts(at),
            "schema_version": "1.0",
            "sensors": {
                "temperature_c": 24.5,
                "humidity_pct": 41.0,
                "co_ppm": 3.0 + n % 40,
                "smoke_obscuration_pct": 0.1,
                "vibration_mm_s": 1.2,
                "noise_db": 71.0,
            },
            "ai": {
                "model_version": "yolo-1",
                "detections": [{"label": "no_helmet", "confidence": 0.81, "camera_id": "cam-1"}],
            },
        }
    ).encode()


async def messages(
    bench: Bench, processor: Processor, clock: FixedClock, bucket: str, count: int, factories: int
) -> Measured:
    """``count`` factory_state messages, one per factory: the raw put ingest makes, then the
    processor's handling of the RawArchived event ingest publishes (inline payload)."""
    store = ObjectStore(bench.clients, bucket)
    run = uuid.uuid4().hex[:6]

    async def one(n: int) -> None:
        factory = fid(n % factories)
        received = clock.now
        mid = f"{factory}-{run}-{n:06d}"
        payload = factory_state_payload(factory, mid, received - timedelta(milliseconds=300), n)
        decision = admit(topic_for(factory, "factory_state"), payload, received, 1, bucket=bucket)
        assert isinstance(decision, Archive)
        await store.put_immutable(decision.key, payload, metadata=decision.metadata)
        outcome = await processor.handle(decision.event)
        assert outcome.latest == "applied", outcome

    async def work() -> None:
        slots = asyncio.Semaphore(16)

        async def bounded(n: int) -> None:
            async with slots:
                await one(n)

        await asyncio.gather(*(bounded(n) for n in range(count)))

    return await bench.measure("messages", work)


async def aggregator_runs(
    bench: Bench, fleet: Fleet, bucket: str, now: datetime, pub: Published, sample: int
) -> tuple[Measured, Measured, datetime]:
    """One window for AGGREGATOR_SAMPLE factories, and the per-window work around it (its claims
    look-back, the claim, the fleet ids, the finish) with the whole fleet."""
    rm = ReadModel(bench.clients.items, bench.table)
    agg = Aggregator(
        readmodel=rm,
        store=ObjectStore(bench.clients, bucket),
        publish=pub.one,
        ttl=fleet.ttl,
        clock=FixedClock(now),
    )
    start = window_of(fleet.now)
    ids = await rm.fleet_ids()

    async def window() -> Any:
        return await agg.run_window(start, ids[:sample], now=now)

    run = await bench.measure("aggregator window", window)

    async def around() -> None:
        due = agg.due_windows(now)
        claims = await rm.window_claims(
            AGGREGATOR_JOB, due[0], due[-1] + keys.GRAPH_BUCKET, now=now
        )
        won = await rm.claim_pending(
            AGGREGATOR_JOB, due[-1], claims=claims, owner=agg.owner, now=now,
            ttl=expires_at(now, 3 * 86_400), lease=agg.lease,
        )  # fmt: skip
        await rm.fleet_ids()
        if won:
            await rm.finish_window(AGGREGATOR_JOB, due[-1], owner=agg.owner, now=now)

    overhead = await bench.measure("aggregator tick overhead", around)
    return run, overhead, start


async def collector_runs(
    bench: Bench, endpoint: str, bucket: str, nats_url: str, now: datetime, pub: Published
) -> tuple[Measured, Measured]:
    settings = CollectorSettings(
        aws_endpoint_url=endpoint,
        bucket=bucket,
        table=bench.table,
        nats_url=nats_url,
        expected_services=[],
        expected_consumers=["AEGIS_RAW/processor"],
        storage_slow_ms=5000,
        cloudwatch_enabled=False,
        # a probe that outlives the timeout is cut short (CHECK_FAILED): here every probe runs
        # to its end, however slow this emulator is, so its requests are all counted
        collector_check_timeout_s=3600,
        log_level="WARNING",
    )
    clock = FixedClock(now)
    app = create_collector_app(settings, clock=clock, background=False)
    await app.start()
    try:
        assert app.clients is not None
        bench.meter.attach(app.clients)
        for collector in app.collectors.values():
            collector.publish = pub.one  # counted, not sent
        fast = await bench.measure("fast collector", app.collectors["fast"].tick)
        slow = await bench.measure("slow collector", app.collectors["slow"].tick)
    finally:
        await app.stop()
    assert fast.result is not None and slow.result is not None, "a collector window was not run"
    return fast, slow


# ---------------------------------------------------------------------------------------------
# 4. Dashboard


def percentile(samples: Sequence[float], p: float) -> float:
    ordered = sorted(samples)
    return round(ordered[max(0, math.ceil(len(ordered) * p) - 1)], 2)


async def rate_over(url: str, seconds: float) -> dict[str, Any]:
    """The storage requests counted over ``seconds`` (nothing of this process's meanwhile)."""
    before = await counted(url)
    await asyncio.sleep(seconds)
    counts = await counted(url) - before
    elapsed = counts.at - counts.since
    return {
        "seconds": round(elapsed, 2),
        "counts": counts,
        "dynamodb_per_s": {op: round(n / elapsed, 3) for op, n in counts.ops("dynamodb").items()},
        "s3_per_s": {op: round(n / elapsed, 3) for op, n in counts.ops("s3").items()},
        "dynamodb_items_per_s": round(counts.items_returned() / elapsed, 1),
        "dynamodb_bytes_per_s": round(counts.bytes_returned() / elapsed),
    }


async def screens_open(url: str, screens: int, seconds: float, emulator: str) -> dict[str, Any]:
    """``screens`` /api/live streams open (each reads its snapshot), then the rate over
    ``seconds`` with nothing else going on."""
    opened = 0
    ready = asyncio.Event()
    stop = asyncio.Event()

    async def screen(client: httpx.AsyncClient) -> None:
        nonlocal opened
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with client.stream("GET", "/api/live", headers=headers) as resp:
            async for line in resp.aiter_lines():
                if line == "event: cloud":  # the snapshot's last event: this screen is live
                    opened += 1
                    if opened == screens:
                        ready.set()
                if stop.is_set():
                    return

    limits = httpx.Limits(max_connections=screens + 10)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        before = await counted(emulator)
        tasks = [asyncio.create_task(screen(client)) for _ in range(screens)]
        await asyncio.wait_for(ready.wait(), 120)
        connect = await counted(emulator) - before
        rate = await rate_over(emulator, seconds)
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    rate["connect_counts"] = connect
    return rate


async def dashboard_phase(
    bench: Bench, emulator: str, nats_url: str, bucket: str, screens: int, seconds: float
) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEGIS_")} | {
        "AEGIS_AWS_ENDPOINT_URL": emulator,
        "AEGIS_BUCKET": bucket,
        "AEGIS_TABLE": bench.table,
        "AEGIS_DASHBOARD_PORT": str(port),
        "AEGIS_DASHBOARD_TOKENS": "responder:" + hashlib.sha256(TOKEN.encode()).hexdigest(),
        "AEGIS_LOG_LEVEL": "WARNING",
        "AEGIS_NATS_URL": nats_url,
    }
    server = await asyncio.to_thread(
        subprocess.Popen,
        [str(SCRIPTS / "aegis-dashboard-api")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await asyncio.to_thread(wait_ready, url, 60)
        await asyncio.to_thread(fleet_latencies, url, 20)  # warm-up
        requests = 300
        samples = await asyncio.to_thread(fleet_latencies, url, requests)
        progress(f"dashboard: /api/fleet p99 {percentile(samples, 0.99)} ms; no screen open ...")
        idle = await rate_over(emulator, min(10.0, seconds))
        progress(f"dashboard: {screens} /api/live screens open for {seconds:g} s ...")
        live = await screens_open(url, screens, seconds, emulator)
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
    return {
        "url": url,
        "requests": requests,
        "p50_ms": percentile(samples, 0.50),
        "p95_ms": percentile(samples, 0.95),
        "p99_ms": percentile(samples, 0.99),
        "idle": idle,
        "live": live,
        "screens": screens,
    }


# ---------------------------------------------------------------------------------------------
# Units of the dashboard (another process: its units from the per-request units measured here)


def unit_rates(measured: Iterable[Measured]) -> dict[str, dict[str, float]]:
    """Read units per request and per returned item of each operation, over ``measured``."""
    total: dict[str, OpUnits] = defaultdict(OpUnits)
    for m in measured:
        for op, units in m.units.items():
            total[op].add(units)
    return {
        op: {
            "rru_per_request": u.rru / u.requests if u.requests else 0.0,
            "rru_per_item": u.rru / u.items if u.items else 0.0,
        }
        for op, u in total.items()
    }


def estimated_rru_of(
    counts: RequestCounts, op: str, rates: Mapping[str, Mapping[str, float]]
) -> float:
    """Read units of ``op``'s requests in ``counts``: a BatchGetItem's by the items returned,
    the others' by request, at the rates measured in this process."""
    rate = rates.get(op, {})
    if op == "BatchGetItem":
        return counts.items_returned(op) * rate.get("rru_per_item", 0.5)
    return counts.count("dynamodb", op) * rate.get("rru_per_request", 0.5)


def estimated_rru(counts: RequestCounts, rates: Mapping[str, Mapping[str, float]]) -> float:
    return sum(estimated_rru_of(counts, op, rates) for op in counts.ops("dynamodb"))


# ---------------------------------------------------------------------------------------------
# 6-7. Background and cost


@dataclass
class Usage:
    """Requests and units of one source, per run (or per message, per second)."""

    ddb_requests: dict[str, float]
    wru: float
    rru: float
    s3: dict[str, float]

    @classmethod
    def of(cls, m: Measured, scale: float = 1.0) -> Usage:
        return cls(
            ddb_requests={op: n * scale for op, n in m.ddb().items()},
            wru=m.wru() * scale,
            rru=m.rru() * scale,
            s3={op: n * scale for op, n in m.s3().items()},
        )

    def plus(self, other: Usage) -> Usage:
        ops = defaultdict(float, self.ddb_requests)
        for op, n in other.ddb_requests.items():
            ops[op] += n
        s3 = defaultdict(float, self.s3)
        for op, n in other.s3.items():
            s3[op] += n
        return Usage(dict(ops), self.wru + other.wru, self.rru + other.rru, dict(s3))

    def times(self, k: float) -> Usage:
        return Usage(
            {op: n * k for op, n in self.ddb_requests.items()},
            self.wru * k,
            self.rru * k,
            {op: n * k for op, n in self.s3.items()},
        )

    def write_requests(self) -> float:
        return sum(self.ddb_requests.get(op, 0) for op in DDB_WRITE_OPS)

    def read_requests(self) -> float:
        return sum(self.ddb_requests.values()) - self.write_requests()

    def tiers(self) -> dict[str, float]:
        tiers = {"put": 0.0, "list": 0.0, "get": 0.0}
        for op, n in self.s3.items():
            tier = "put" if op in S3_PUT_OPS else "list" if op in S3_LIST_OPS else "get"
            tiers[tier] += n
        return tiers

    def as_dict(self) -> dict[str, Any]:
        return {
            "dynamodb_requests": {op: round(n, 3) for op, n in sorted(self.ddb_requests.items())},
            "dynamodb_read_units": round(self.rru, 3),
            "dynamodb_write_units": round(self.wru, 3),
            "s3_requests": {op: round(n, 3) for op, n in sorted(self.s3.items())},
            "s3_by_price_tier": {k: round(v, 3) for k, v in self.tiers().items()},
        }


def cost_lines(
    messages_per_day: float, per_message: Usage, background: Usage
) -> list[dict[str, Any]]:
    day_bg = background
    lines = [
        {
            "line": "DynamoDB writes (messages + background)",
            "requests_per_day": per_message.write_requests() * messages_per_day
            + day_bg.write_requests(),
            "units_per_day": per_message.wru * messages_per_day + day_bg.wru,
            "unit": "WRU",
            "price": DDB_WRITE_PER_MILLION_WRU / 1e6,
        },
        {
            "line": "DynamoDB background reads",
            "requests_per_day": day_bg.read_requests(),
            "units_per_day": day_bg.rru,
            "unit": "RRU",
            "price": DDB_READ_PER_MILLION_RRU / 1e6,
        },
        {
            "line": "DynamoDB reads per message",
            "requests_per_day": per_message.read_requests() * messages_per_day,
            "units_per_day": per_message.rru * messages_per_day,
            "unit": "RRU",
            "price": DDB_READ_PER_MILLION_RRU / 1e6,
        },
    ]
    for tier, name, price in (
        ("put", "S3 PUTs", S3_PUT_PER_THOUSAND / 1000),
        ("get", "S3 GETs (and other requests)", S3_GET_PER_THOUSAND / 1000),
        ("list", "S3 LISTs", S3_PUT_PER_THOUSAND / 1000),
    ):
        n = per_message.tiers()[tier] * messages_per_day + day_bg.tiers()[tier]
        lines.append(
            {
                "line": name,
                "requests_per_day": n,
                "units_per_day": n,
                "unit": "requests",
                "price": price,
            }
        )
    for line in lines:
        line["usd_per_day"] = round(line["units_per_day"] * line.pop("price"), 4)
        line["requests_per_day"] = round(line["requests_per_day"])
        line["units_per_day"] = round(line["units_per_day"])
    return lines


# ---------------------------------------------------------------------------------------------
# Printing


def ops_text(ops: Mapping[str, float]) -> str:
    return (
        ", ".join(f"{op} {n:,.0f}" if n >= 10 else f"{op} {n:g}" for op, n in sorted(ops.items()))
        or "-"
    )


def print_listings(rows: Sequence[Mapping[str, Any]]) -> None:
    head = (
        f"{'depth':>5}  {'listing':<14} {'path':<6} {'requests':<38} {'index rd':>8} "
        f"{'table rd':>9} {'returned':>8} {'tbl/ret':>8} {'idx/ret':>7} {'bytes rd':>11} "
        f"{'RRU':>8} {'s':>7}"
    )
    print(head)
    for r in rows:
        t = r["table_read_per_returned"]
        x = r["index_read_per_returned"]
        print(
            f"{r['depth']:>5}  {r['listing']:<14} {r['path']:<6} {ops_text(r['requests']):<38} "
            f"{r['index_entries_read']:>8,} {r['table_items_read']:>9,} {r['items_returned']:>8,} "
            f"{'-' if t is None else f'{t:.2f}':>8} {'-' if not x else f'{x:.2f}':>7} "
            f"{r['item_bytes_read']:>11,} {r['read_units']:>8,.1f} {r['seconds']:>7.2f}"
        )


def print_measured(name: str, m: Measured, extra: str = "") -> None:
    print(
        f"  {name:<34} {m.seconds:7.2f} s  DynamoDB: {ops_text(m.ddb())}; S3: {ops_text(m.s3())}; "
        f"RRU {m.rru():,.1f}, WRU {m.wru():,.0f}{extra}"
    )


def print_usage(name: str, u: Usage, note: str = "") -> None:
    print(
        f"  {name:<44} DynamoDB {sum(u.ddb_requests.values()):>10,.1f} req "
        f"({u.read_requests():,.1f} read, {u.write_requests():,.1f} write), RRU {u.rru:>9,.1f}, "
        f"WRU {u.wru:>8,.1f}; S3 put {u.tiers()['put']:,.1f}, get {u.tiers()['get']:,.1f}, "
        f"list {u.tiers()['list']:,.1f}{note}"
    )


def print_costs(title: str, lines: Sequence[Mapping[str, Any]]) -> str:
    print(title)
    print(f"  {'line':<42} {'requests/day':>15} {'units/day':>15} {'unit':<8} {'$/day':>10}")
    for line in lines:
        print(
            f"  {line['line']:<42} {line['requests_per_day']:>15,} {line['units_per_day']:>15,} "
            f"{line['unit']:<8} {line['usd_per_day']:>10,.2f}"
        )
    total = sum(line["usd_per_day"] for line in lines)
    biggest = max(lines, key=lambda line: line["usd_per_day"])
    print(f"  {'total':<42} {'':>15} {'':>15} {'':<8} {total:>10,.2f}")
    print(f"  biggest line: {biggest['line']} (${biggest['usd_per_day']:,.2f}/day)")
    return str(biggest["line"])


# ---------------------------------------------------------------------------------------------
# The run


def jsonable(value: Any) -> Any:
    if isinstance(value, RequestCounts):
        return {"requests": value.requests, "seconds": round(value.at - value.since, 3)}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, datetime):
        return format_ts(value)
    return value


async def collect(
    args: argparse.Namespace, emulator: str, nats_url: str, emulator_pid: int | None
) -> dict[str, Any]:
    """Every measurement, in an order that keeps the bench short: the slow cloud collector (it
    reads each factory's last hour of HISTORY) runs at the first depth, the aggregator window
    at the second (60 HISTORY items in it with the default depths)."""
    depths = [int(d) for d in args.depths.split(",")]
    if len(depths) != 2 or not 0 < depths[0] < depths[1]:
        raise SystemExit("--depths takes two increasing numbers, e.g. 20,200")
    aegis_logging.configure("console", "WARNING")  # the platform's own lines: warnings only
    factories = args.factories
    sample = min(AGGREGATOR_SAMPLE, factories)
    uid = uuid.uuid4().hex[:8]
    bucket, table = f"aegis-fleet-{uid}", f"AEGIS-fleet-{uid}"
    now = truncate_ms(datetime.now(UTC)).replace(microsecond=0)
    rules = load_rules(None).with_staleness(None, None)
    meter = Meter()
    got: dict[str, Any] = {"depths": depths, "sample": sample, "now": now}
    config = AwsConfig(endpoint_url=emulator, max_pool_connections=64)
    async with open_clients(config) as clients:
        meter.attach(clients)
        bench = Bench(emulator, clients, meter, table, emulator_pid)
        writer = RawWriter(emulator, clients.config.region)
        await bootstrap(clients, bucket=bucket, table=table)
        try:
            # 1. seed
            progress(f"seeding {factories:,} factories at depth {depths[0]} ...")
            fleet = await asyncio.to_thread(make_fleet, factories, now, rules, TtlSettings())
            got["fleet"] = fleet
            got["seed"] = await seed(bench, writer, fleet, factories, depths[0])
            got["seed_families"] = {
                f: (c, fleet.bytes[f] // max(1, c)) for f, c in fleet.items.items()
            }
            progress(f"seeded {got['seed'][0].result:,} items in {got['seed'][0].seconds:.1f} s")
            objects, records = await asyncio.to_thread(s3_objects, fleet, factories, sample)
            got["s3_seed"] = await bench.measure(
                "s3 seed", lambda: writer.put_objects(bucket, objects)
            )
            got["s3_seed"].result = (len(objects), records)
            progress(f"put {len(objects):,} objects in {got['s3_seed'].seconds:.1f} s")
            # a filtered Scan's dropped items are sized as the average item it did not return
            meter.unreturned_item_size = fleet.mean_size(["history", "graph", "alert", "claim"])

            # 2. listings at the first depth
            got["rows"] = await listings(bench, fleet, depths[0])
            got["per_factory"] = [fleet.total_items / factories]

            # 6. the cloud collectors (the slow one reads every factory's last hour of HISTORY)
            progress("cloud collectors ...")
            got["fast"], got["slow"] = await collector_runs(
                bench, emulator, bucket, nats_url, now + timedelta(seconds=140), Published()
            )
            progress(
                f"collectors: fast {got['fast'].seconds:.1f} s, slow {got['slow'].seconds:.1f} s; "
                f"adding HISTORY to depth {depths[1]} ..."
            )

            # 2. the second depth
            got["deepen"] = await deepen(bench, writer, fleet, factories, depths[1])
            progress(f"added {got['deepen'][0].result:,} items in {got['deepen'][0].seconds:.1f} s")
            meter.unreturned_item_size = fleet.mean_size(["history", "graph", "alert", "claim"])
            got["rows"] += await listings(bench, fleet, depths[1])
            got["per_factory"].append(fleet.total_items / factories)
        finally:
            await writer.close()
        progress("listings done; refresh ticks ...")

        # 3. refresh: quiet (LATEST fresh, nothing to write), then every factory due
        pub = Published()
        clock = FixedClock(now + timedelta(seconds=1))
        processor = new_processor(bench, fleet, bucket, clock, pub)
        got["quiet"] = await refresh_tick(bench, processor, clock, "refresh quiet")
        got["quiet_events"] = pub.events
        clock.now = now + timedelta(seconds=120)
        got["due"] = await refresh_tick(bench, processor, clock, "refresh due")
        got["due_events"] = pub.events - got["quiet_events"]
        # every factory due again, the meter off: the platform's own seconds and CPU (the meter's
        # hooks run in this process and would count as the platform's)
        meter.detach(clients)
        clock.now = now + timedelta(seconds=240)
        before_bare = pub.events
        got["due_bare"] = await refresh_tick(bench, processor, clock, "refresh due, no meter")
        got["due_bare_events"] = pub.events - before_bare
        meter.attach(clients)
        progress(
            f"refresh: quiet {got['quiet'].seconds:.1f} s, due {got['due'].seconds:.1f} s "
            f"({got['due_bare'].seconds:.1f} s without the meter); "
            "dashboard ..."
        )

        # 4. dashboard
        got["dash"] = await dashboard_phase(
            bench, emulator, nats_url, bucket, args.screens, args.seconds
        )
        progress("dashboard done; messages ...")

        # 5. messages through ingest's put and the processor
        clock.now = now + timedelta(seconds=125)
        before = pub.events
        got["msgs"] = await messages(bench, processor, clock, bucket, args.messages, factories)
        got["msg_events"] = pub.events - before
        progress(f"{args.messages} messages in {got['msgs'].seconds:.1f} s; aggregator ...")

        # 6. the aggregator window
        got["window"], got["agg_overhead"], got["agg_start"] = await aggregator_runs(
            bench, fleet, bucket, now + AGGREGATOR_AFTER, pub, sample
        )
        progress("aggregator done")
    return got


def slow_at_production(slow: Measured, factories: int) -> tuple[Usage, dict[str, Any]]:
    """The slow collector's run with each factory's HISTORY#STATE of the last hour at the
    production cadence (one snapshot per 5 s: 720): its HISTORY Query per factory read that
    many items of the size measured here, in pages of 1 MB, each page's units its bytes rounded
    up to 4 KB, at the consistency measured here. The rest of the run as measured."""
    usage = Usage.of(slow)
    hist = slow.detail.get("Query[HISTORY]")
    if hist is None or not hist.items:
        return usage, {}
    per_factory = hist.items / factories
    size = hist.bytes_read / hist.items
    # strongly consistent (1 unit per 4 KB) or not (0.5), from what the measured pages cost
    per_request = hist.bytes_read / hist.requests
    factor = 0.5 if hist.rru / hist.requests < math.ceil(per_request / 4096) else 1.0
    total = PRODUCTION_HISTORY_PER_HOUR * size
    pages = [1_048_576] * int(total // 1_048_576) + [total % 1_048_576]
    pages = [b for b in pages if b > 0]
    rru_per_factory = factor * sum(math.ceil(b / 4096) for b in pages)
    ops = dict(usage.ddb_requests)
    ops["Query"] = ops.get("Query", 0) - hist.requests + factories * len(pages)
    rru = usage.rru - hist.rru + factories * rru_per_factory
    note = {
        "extrapolated": True,
        "history_items_read_per_factory": round(per_factory, 1),
        "production_history_items_per_factory": PRODUCTION_HISTORY_PER_HOUR,
        "mean_history_item_bytes": round(size),
        "units_per_4kb": factor,
        "history_read_units_measured": round(hist.rru, 1),
        "history_read_units_production": round(factories * rru_per_factory, 1),
        "history_pages_per_factory_production": len(pages),
    }
    return Usage(ops, usage.wru, rru, dict(usage.s3)), note


def report(args: argparse.Namespace, got: dict[str, Any]) -> dict[str, Any]:
    """The figures, the printed table and the JSON."""
    factories, sample = args.factories, got["sample"]
    d1, d2 = got["depths"]
    seeded, built, seed_wru = got["seed"]
    deepened, deepen_wru = got["deepen"]
    s3_seed: Measured = got["s3_seed"]
    rows: list[dict[str, Any]] = got["rows"]
    x1, x2 = got["per_factory"]
    quiet, due, msgs = got["quiet"], got["due"], got["msgs"]
    window, agg_overhead, fast, slow = (
        got["window"],
        got["agg_overhead"],
        got["fast"],
        got["slow"],
    )
    dash = got["dash"]
    n = args.messages

    # units of the dashboard (another process) at the per-request units measured here
    rates = unit_rates([quiet, due, msgs, window, agg_overhead, fast, slow])
    idle_counts: RequestCounts = dash["idle"]["counts"]
    live_counts: RequestCounts = dash["live"]["counts"]
    idle_s, live_s = dash["idle"]["seconds"], dash["live"]["seconds"]

    def rate_usage(counts: RequestCounts, seconds: float) -> Usage:
        return Usage(
            {op: c / seconds for op, c in counts.ops("dynamodb").items()},
            0.0,
            estimated_rru(counts, rates) / seconds,
            {op: c / seconds for op, c in counts.ops("s3").items()},
        )

    dash_idle, dash_live = rate_usage(idle_counts, idle_s), rate_usage(live_counts, live_s)
    per_screen_hour = dash_live.plus(dash_idle.times(-1)).times(3600 / max(1, args.screens))

    per_message = Usage.of(msgs, 1 / n)
    scale = factories / sample
    agg_window = Usage.of(window, scale).plus(Usage.of(agg_overhead))
    # HISTORY items the window's queries found per factory: 60 when the second depth reaches
    # back past the window, fewer with a shallow one (then by where in its 5 minutes the bench
    # started: the window's units, and the day's cost with them, move with it)
    found = window.detail.get("Query[HISTORY]")
    history_in_window = found.items / sample if found and sample else 0.0
    slow_prod, slow_note = slow_at_production(slow, factories)
    sources: dict[str, tuple[Usage, int]] = {
        "refresh (quiet tick)": (Usage.of(quiet), REFRESH_PER_DAY),
        f"aggregator window (x{scale:g} of {sample})": (agg_window, AGGREGATOR_WINDOWS_PER_DAY),
        "cloud collector fast": (Usage.of(fast), FAST_RUNS_PER_DAY),
        "cloud collector slow (720 HISTORY/factory)": (slow_prod, SLOW_RUNS_PER_DAY),
        f"dashboard ({args.screens} screens open, per s)": (dash_live, 86_400),
    }
    background_day = Usage({}, 0.0, 0.0, {})
    for usage, per_day in sources.values():
        background_day = background_day.plus(usage.times(per_day))
    messages_per_day = MESSAGES_PER_FACTORY_DAY * factories
    lines = cost_lines(messages_per_day, per_message, background_day)

    # the old path: every listing a Scan of the table at production depth (extrapolated)
    scans = {r["depth"]: r for r in rows if r["path"] == "Scan" and r["listing"] == "fleet"}
    xp = PRODUCTION_ITEMS_PER_FACTORY

    def extrapolate(value: Callable[[Mapping[str, Any]], float]) -> float:
        y1, y2 = value(scans[d1]), value(scans[d2])
        return y1 + (y2 - y1) * (xp - x1) / (x2 - x1)

    scan_pages = extrapolate(lambda r: r["requests"].get("Scan", 0))
    scan_read = extrapolate(lambda r: r["table_items_read"])
    scan_rru = extrapolate(lambda r: r["read_units"])

    def index_rru(m: Measured) -> float:
        return sum(u.rru for op, u in m.units.items() if op in LISTING_OPS)

    listing_rru = {
        "refresh": index_rru(quiet),
        "aggregator": index_rru(agg_overhead),
        "fast": index_rru(fast),
        "slow": index_rru(slow),
        "dashboard": sum(estimated_rru_of(live_counts, op, rates) for op in LISTING_OPS) / live_s,
    }
    old_day = Usage({}, 0.0, 0.0, {})
    for (usage, per_day), kind in zip(sources.values(), listing_rru, strict=True):
        listed = usage.ddb_requests.get("Query@fleet", 0) / keys.FLEET_SHARDS
        ops = {o: v for o, v in usage.ddb_requests.items() if o not in LISTING_OPS}
        ops["Scan"] = ops.get("Scan", 0) + listed * scan_pages
        rru = usage.rru - listing_rru[kind] + listed * scan_rru
        old_day = old_day.plus(Usage(ops, usage.wru, rru, dict(usage.s3)).times(per_day))
    old_lines = cost_lines(messages_per_day, per_message, old_day)

    # -- the table ---------------------------------------------------------------------------
    print()
    print(
        f"fleet bench: {factories:,} factories, HISTORY depths {d1}/{d2} per factory, one private "
        "emulator; every request counted at the emulator; events counted, not sent"
    )
    print()
    print(
        "1. seed (BatchWriteItem, 25 items a request, 16 in flight, attributes through indexed())"
    )
    seed_items = seeded.result
    print(
        f"  {seed_items:,} items in {seeded.seconds:.1f} s ({seed_items / seeded.seconds:,.0f} "
        f"items/s, {seeded.counts.count('dynamodb', 'BatchWriteItem'):,} requests, "
        f"{seed_wru:,} WRU; built in {built:.1f} s) [target < {TARGET_SEED_S:.0f} s: "
        f"{'met' if seeded.seconds < TARGET_SEED_S else 'MISSED'}]"
    )
    print(
        "  by family: "
        + ", ".join(f"{f} {c:,} (mean {b:,} B)" for f, (c, b) in got["seed_families"].items())
    )
    objects, records = s3_seed.result
    print(
        f"  S3: {objects:,} objects in {s3_seed.seconds:.1f} s ({ops_text(s3_seed.s3())}): one "
        f"per folder per factory, and {records:,} processed records of 60 messages per factory "
        f"in the aggregated window for {sample}"
    )
    print(
        f"  then HISTORY to depth {d2}: {deepened.result:,} items in {deepened.seconds:.1f} s "
        f"({deepen_wru:,} WRU); table items per factory {x1:.0f} -> {x2:.0f}"
    )
    print()
    print("2. listings (index entries / table items read, items returned, item bytes, read units)")
    print_listings(rows)
    worst = max(
        (r["table_read_per_returned"] or 0)
        for r in rows
        if r["path"] == "index" and r["listing"] != "fleet_ids"
    )
    print(
        f"  index path: table items read / returned at most {worst:.2f} at any depth "
        f"[target <= {TARGET_RATIO}: {'met' if worst <= TARGET_RATIO else 'MISSED'}]; fleet_ids "
        "reads the index only"
    )
    print(
        "  RRU: 0.5 per 4 KB, eventually consistent: of each item (BatchGetItem), of each page "
        "(Query, Scan; a Scan's filtered-out items at the table's mean item size)"
    )
    print(
        f"  old Scan extrapolated to {xp:,} items per factory (linear in table items per factory "
        f"from the two depths): {scan_read:,.0f} items read, {scan_pages:,.0f} pages, "
        f"{scan_rru:,.0f} RRU per listing"
    )
    print()
    print(
        "3. refresh of the fleet (Refresher.tick, the default concurrency, fixed clock, one window)"
    )
    for name, m, events in (
        ("quiet (LATEST fresh)", quiet, got["quiet_events"]),
        ("due (every factory)", due, got["due_events"]),
        ("due again, the meter off", got["due_bare"], got["due_bare_events"]),
    ):
        ok = "met" if m.seconds < TARGET_REFRESH_S else "MISSED"
        print_measured(
            name,
            m,
            f"; {m.result} written, {events} events counted "
            f"[target < {TARGET_REFRESH_S:.0f} s: {ok}]; CPU: emulator {m.cpu[0]:.1f} s "
            f"({1000 * m.cpu[0] / max(1, m.counts.total('dynamodb') + m.counts.total('s3')):.1f} ms a request), this process "
            f"{m.cpu[1]:.1f} s",
        )
    print()
    print(f"4. dashboard API process, {factories:,} factories")
    print(
        f"  GET /api/fleet x{dash['requests']}: p50 {dash['p50_ms']} ms, p95 {dash['p95_ms']} ms, "
        f"p99 {dash['p99_ms']} ms"
    )
    for name, part, usage in (
        ("no screen open", dash["idle"], dash_idle),
        (f"{args.screens} /api/live screens open", dash["live"], dash_live),
    ):
        print(
            f"  {name:<26} {part['seconds']:4.0f} s: DynamoDB/s {ops_text(part['dynamodb_per_s'])}"
            f"; S3/s {ops_text(part['s3_per_s'])}; {part['dynamodb_items_per_s']:,} items/s, "
            f"{part['dynamodb_bytes_per_s']:,} B/s returned, ~{usage.rru:,.1f} RRU/s"
        )
    connect = dash["live"]["connect_counts"]
    print(
        f"  opening the {args.screens} screens: DynamoDB {ops_text(connect.ops('dynamodb'))}; "
        f"S3 {ops_text(connect.ops('s3'))}"
    )
    print(
        "  /api/alerts polled per screen: not emulated: app.js polls nothing (its 1 s timer "
        "redraws ages); alerts, fleet and cloud arrive on the stream"
    )
    print()
    print(f"5. per message ({n} factory_state messages: ingest's raw put + Processor.handle)")
    print_usage("per message", per_message, f"; {got['msg_events'] / n:g} events counted")
    print_measured("all messages", msgs)
    print()
    print("6. background ticks (per run)")
    print_measured("refresh quiet tick", quiet)
    print_measured(f"aggregator window, {sample} factories", window)
    print_measured(
        "aggregator per-window work", agg_overhead, " (claims, claim, fleet ids, finish)"
    )
    print_usage(f"aggregator window scaled x{scale:g}", agg_window)
    for name, m in (
        (f"cloud collector fast (depth {d1})", fast),
        (f"cloud collector slow (depth {d1})", slow),
    ):
        failed = [c.name for c in m.result.checks if c.reason == "CHECK_FAILED"]
        why = sorted({c.reason for c in m.result.checks if c.status.value != "NORMAL"})
        print_measured(
            name,
            m,
            f"; {len(m.result.checks)} checks, status {m.result.status.value}"
            + (f" ({', '.join(why)})" if why else "")
            + (f", probes failed: {', '.join(failed)}" if failed else ""),
        )
    if slow_note:
        print_usage(
            "cloud collector slow, 720 HISTORY/factory",
            slow_prod,
            f" (HISTORY reads scaled from {slow_note['history_items_read_per_factory']:g} to 720 "
            "items a factory: extrapolated)",
        )
    print_usage("dashboard per hour, no screen", dash_idle.times(3600))
    print_usage(f"dashboard per hour, {args.screens} screens", dash_live.times(3600))
    print_usage(
        "dashboard per screen-hour (marginal)",
        per_screen_hour,
        " (rates' difference / screens: noise of the fleet re-reads)",
    )
    print()
    print(
        f"7. cost per day: {factories:,} factories, one message per 5 s "
        f"({messages_per_day:,} messages/day); {PRICE_REGION_NOTE}"
    )
    for name, (usage, per_day) in sources.items():
        print_usage(f"{name} x{per_day:,}", usage.times(per_day))
    biggest = print_costs("  index path", lines)
    biggest_old = print_costs(
        f"  old listing path: every listing a Scan at {xp:,} items per factory (extrapolated)",
        old_lines,
    )

    notes = [
        "Seconds are this emulator's (one request at a time, a shared 2-core machine), not "
        "AWS's; it runs bench-only fast paths that change no answer and no count (checked "
        "against the stock emulator).",
        "Read units from the AWS sizes of the items in each answer: BatchGetItem and GetItem "
        "per item, Query and Scan per page, rounded up to 4 KB, 0.5 eventually / 1 strongly "
        "consistent; a filtered Scan's dropped items at the table's mean item size (they are "
        "not in the answer). The dashboard is another process: its units are its counted "
        "requests at the units per request measured here.",
        "Write units: ceil(item size / 1 KB) per item from the request's attributes (an "
        "UpdateItem: the item as stored after it; a DeleteItem: 1). Index writes are not "
        "counted: a LATEST rewrite keeps the KEYS_ONLY index keys, which AWS does not rewrite.",
        f"The slow cloud collector ran at the first depth ({d1} HISTORY items per factory); its "
        "HISTORY reads are extrapolated to 720 per factory (one per 5 s, the hour it reads), "
        "in 1 MB pages, for the cost table.",
        f"Old path: the Scan's items read, pages and units per listing extrapolated linearly "
        f"in table items per factory from the two depths to {xp:,}; the same number of "
        "listings as the index path made here (a Scan of millions of items takes far longer "
        "than the dashboard's 1 s between re-reads: in practice fewer, much slower listings).",
        "The dashboard re-reads the fleet 1 s after each read ends; a read took about 1 s on "
        "this emulator (about 0.5 reads/s here); on AWS (tens of ms a read) nearly 1/s, about "
        "twice the dashboard's requests and units shown.",
        f"Messages: one factory_state each for {n} factories whose LATEST the processor holds "
        "in its cache (a processor that keeps running); no infra_state or image messages.",
        f"Aggregator: one window of {sample} factories, each with {history_in_window:g} HISTORY "
        "items in it (60 when the second depth reaches back past the window; with a shallower "
        "one, fewer, by where in its 5 minutes the bench started, and the window's units move "
        f"with them) and the 120 processed records of 60 messages, scaled x{scale:g}; the "
        "per-window work "
        "(24 h of claims read back, the claim, fleet ids, the finish) once for the fleet.",
        "Scan pages are moto's (it sizes items a little differently for its 1 MB pages); the "
        "units do not depend on the paging.",
    ]
    print()
    print("notes:")
    for note in notes:
        print(f"  - {note}")

    return {
        "notes": notes,
        "factories": factories,
        "depths": [d1, d2],
        "emulator": "moto_server with aegis_devstack.motoserver's patches (serialized, counted) "
        "and bench-only fast paths (same answers and counts)",
        "events": "counted by a stand-in, not sent",
        "seed": {
            "seconds": round(seeded.seconds, 2),
            "build_seconds": round(built, 2),
            "target_seconds": TARGET_SEED_S,
            "items_written": seed_items,
            "items_by_family": {f: c for f, (c, _) in got["seed_families"].items()},
            "mean_item_bytes": {f: b for f, (_, b) in got["seed_families"].items()},
            "batch_write_requests": seeded.counts.count("dynamodb", "BatchWriteItem"),
            "write_units": seed_wru,
            "s3_objects": objects,
            "s3_window_records": records,
            "s3_seconds": round(s3_seed.seconds, 2),
            "deepen_items": deepened.result,
            "deepen_seconds": round(deepened.seconds, 2),
            "deepen_write_units": deepen_wru,
        },
        "listings": rows,
        "table_items_per_factory": [round(x1, 1), round(x2, 1)],
        "old_scan_at_production_depth": {
            "items_per_factory": xp,
            "extrapolated": True,
            "items_read_per_listing": round(scan_read),
            "pages_per_listing": round(scan_pages, 1),
            "read_units_per_listing": round(scan_rru, 1),
        },
        "refresh": {
            "concurrency": 16,
            "target_seconds": TARGET_REFRESH_S,
            "quiet": {**quiet.summary(), "written": quiet.result, "events": got["quiet_events"]},
            "due": {**due.summary(), "written": due.result, "events": got["due_events"]},
            "due_without_meter": {**got["due_bare"].summary(), "written": got["due_bare"].result},
        },
        "dashboard": {
            "fleet_requests": dash["requests"],
            "p50_ms": dash["p50_ms"],
            "p95_ms": dash["p95_ms"],
            "p99_ms": dash["p99_ms"],
            "idle": {k: v for k, v in dash["idle"].items() if k != "counts"},
            "screens": {
                k: v for k, v in dash["live"].items() if k not in ("counts", "connect_counts")
            },
            "screens_open": args.screens,
            "screen_connect_requests": {
                "dynamodb": connect.ops("dynamodb"),
                "s3": connect.ops("s3"),
            },
            "read_units_per_s_idle": round(dash_idle.rru, 3),
            "read_units_per_s_screens": round(dash_live.rru, 3),
            "alerts_polling": "not emulated: app.js requests nothing periodically",
        },
        "per_message": {
            "messages": n,
            **per_message.as_dict(),
            "events": got["msg_events"] / n,
            "seconds": round(msgs.seconds, 2),
        },
        "background": {
            "refresh_quiet": Usage.of(quiet).as_dict(),
            "refresh_due": Usage.of(due).as_dict(),
            "aggregator_window_sample": {
                **Usage.of(window).as_dict(),
                "factories": sample,
                "history_items_per_factory": history_in_window,
            },
            "aggregator_window_work": Usage.of(agg_overhead).as_dict(),
            "aggregator_window_scaled": {**agg_window.as_dict(), "scale": scale},
            "aggregator_window_start": format_ts(got["agg_start"]),
            "cloud_fast": {**Usage.of(fast).as_dict(), "seconds": round(fast.seconds, 2)},
            "cloud_slow": {
                **Usage.of(slow).as_dict(),
                "seconds": round(slow.seconds, 2),
                "depth": d1,
            },
            "cloud_slow_production": {**slow_prod.as_dict(), **slow_note},
            "dashboard_per_hour_no_screen": dash_idle.times(3600).as_dict(),
            "dashboard_per_hour_screens_open": dash_live.times(3600).as_dict(),
            "dashboard_per_screen_hour_marginal": per_screen_hour.as_dict(),
        },
        "prices": {
            "note": PRICE_REGION_NOTE,
            "dynamodb_write_per_million_wru": DDB_WRITE_PER_MILLION_WRU,
            "dynamodb_read_per_million_rru": DDB_READ_PER_MILLION_RRU,
            "s3_put_copy_post_list_per_thousand": S3_PUT_PER_THOUSAND,
            "s3_get_per_thousand": S3_GET_PER_THOUSAND,
        },
        "cost_per_day": {
            "messages_per_day": messages_per_day,
            "sources": {k: {**u.times(d).as_dict(), "per_day": d} for k, (u, d) in sources.items()},
            "lines": lines,
            "total_usd": round(sum(line["usd_per_day"] for line in lines), 2),
            "biggest": biggest,
        },
        "cost_per_day_old_path": {
            "lines": old_lines,
            "total_usd": round(sum(line["usd_per_day"] for line in old_lines), 2),
            "biggest": biggest_old,
        },
        "unit_rates": rates,
    }


async def run(
    args: argparse.Namespace, emulator: str, nats_url: str, emulator_pid: int | None
) -> dict[str, Any]:
    got = await collect(args, emulator, nats_url, emulator_pid)
    return jsonable(report(args, got))  # type: ignore[no-any-return]


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-emulator":
        serve_emulator(int(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--factories", type=int, default=1000)
    parser.add_argument("--depths", default="20,200", help="HISTORY items per factory, two depths")
    parser.add_argument("--screens", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="aegis-bench-fleet-"))
    emulator = private_nats = None
    try:
        emulator = start_emulator(scratch)
        private_nats = start_private_nats()
        progress(f"emulator {emulator.url}, NATS {private_nats.url}")
        pid = None if emulator.process is None else emulator.process.pid
        # the processor's and the dashboard's code run in the event loop their services run in
        with service_runner() as runner:
            result = runner.run(run(args, emulator.url, private_nats.url, pid))
    finally:
        for server in (private_nats, emulator):
            if server is not None:
                # close(): stopped for good, its temp folder removed (stop() keeps it for a
                # restart)
                (getattr(server, "close", None) or server.stop)()
        shutil.rmtree(scratch, ignore_errors=True)
    result["seconds_total"] = round(time.perf_counter() - START, 1)
    print(f"\ntotal {result['seconds_total']:.0f} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
    exit_process(0)  # not finalized: the S3 client's threads could crash it (exit_process)
