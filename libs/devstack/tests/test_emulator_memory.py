"""The emulator (aegis_devstack.motoserver) keeps the data it is given, not the requests it served.

`make run` took the emulator from 134 MB to 1.7 GB in 8.5 minutes: moto kept every object each
request made (the items a Query copied into its answer, the whole-table copy TransactWriteItems
takes per item to roll back with) and a cycle per request that only a full collection, which the
emulator defers, would free. These tests serve such requests against a fixed data set and read the
server's resident memory (``/proc/<pid>/statm``) before and after: it must not grow with the
number of requests. A separate server shortens the stream's retention and the iterators' lifetime
to see them trimmed and expired as on AWS.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from aegis_devstack.localservers import (
    MotoServer,
    free_port,
    start_moto_server,
    wait_for_port,
)
from aegis_devstack.testing.emulator import fleet_table

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads RSS from /proc"),
]

REGION = "ap-south-1"
TABLE = "aegis-memory"
ITEMS = 200  # the fixed data set: every Query of the index answers all of them
# resident memory a served request may add, on average: the leaks were ~170 KB per Query of 200
# items and a table's size per transaction item; allocator noise over a few hundred requests is
# well under this
BOUND_KB_PER_REQUEST = 8.0


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * 4  # resident pages of 4 KiB


def _peak_rss_kb(pid: int) -> int:
    """The process's resident high-water mark (VmHWM) since it was last reset."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def _reset_peak_rss(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # 5: reset the peak RSS (proc(5))


def _client(url: str, service: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=url,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    log = tmp_path_factory.mktemp("moto-memory") / "moto.log"
    running = start_moto_server("127.0.0.1", free_port(), log_file=log)
    try:
        yield running
    finally:
        running.stop()


def _create_table(ddb: Any, name: str = TABLE) -> None:
    ddb.create_table(**fleet_table(name, stream=True))


def _key(n: int) -> dict[str, Any]:
    return {"pk": {"S": f"FACTORY#f{n:04d}"}, "sk": {"S": "LATEST"}}


def _query_fleet(ddb: Any) -> None:
    answer = ddb.query(
        TableName=TABLE,
        IndexName="fleet",
        KeyConditionExpression="fleet_pk = :fleet",
        ExpressionAttributeValues={":fleet": {"S": "FLEET"}},
    )
    assert answer["Count"] == ITEMS


def _check_claims(ddb: Any) -> None:
    """A transaction that writes nothing (condition checks) of 5 items: moto copies the table
    once per item to roll back with."""
    ddb.transact_write_items(
        TransactItems=[
            {
                "ConditionCheck": {
                    "TableName": TABLE,
                    "Key": _key(n),
                    "ConditionExpression": "attribute_exists(pk)",
                }
            }
            for n in range(5)
        ]
    )


def test_serving_requests_on_fixed_data_does_not_grow_the_emulator(server: MotoServer) -> None:
    ddb = _client(server.url, "dynamodb")
    _create_table(ddb)
    for n in range(ITEMS):  # ~1 KB items, as the fleet's LATEST rows
        item = {**_key(n), "fleet_pk": {"S": "FLEET"}, "fleet_sk": {"S": f"f{n:04d}"}}
        item["reasons"] = {"S": "r" * 900}
        ddb.put_item(TableName=TABLE, Item=item)
    for _ in range(30):  # warm up: imports, caches, the allocator's pools
        _query_fleet(ddb)
    for _ in range(10):
        _check_claims(ddb)

    before = _rss_kb(server.process.pid)
    served = 0
    for round_ in range(15):
        for _ in range(10):
            _query_fleet(ddb)
        _check_claims(ddb)
        served += 11
        if round_ % 5 == 4:
            ddb.get_item(TableName=TABLE, Key=_key(round_))
            served += 1
    after = _rss_kb(server.process.pid)

    per_request = (after - before) / served
    assert per_request < BOUND_KB_PER_REQUEST, (
        f"the emulator grew {after - before} KB over {served} requests on a fixed data set "
        f"({per_request:.1f} KB per request; {before} KB -> {after} KB)"
    )


# -- stream records and shard iterators: trimmed and expired as on AWS -------------------------

SHORT = 2.0  # seconds: the shortened stream retention and iterator lifetime


@pytest.fixture
def short_lived(tmp_path: Path) -> Iterator[str]:
    """An emulator whose stream keeps records :data:`SHORT` seconds and whose shard iterators
    expire after as long."""
    port = free_port()
    code = (
        "import sys\n"
        "from aegis_devstack import motoserver\n"
        f"motoserver.STREAM_RETENTION_S = motoserver.SHARD_ITERATOR_LIFETIME_S = {SHORT}\n"
        "motoserver.main(sys.argv[1:])\n"
    )
    with (tmp_path / "moto.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", code, "-H", "127.0.0.1", "-p", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_port("127.0.0.1", port, timeout=20)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_stream_records_are_trimmed_and_shard_iterators_expire(short_lived: str) -> None:
    ddb, streams = _client(short_lived, "dynamodb"), _client(short_lived, "dynamodbstreams")
    _create_table(ddb)
    arn = ddb.describe_table(TableName=TABLE)["Table"]["LatestStreamArn"]
    shard = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]

    def iterator(kind: str = "TRIM_HORIZON") -> str:
        answer = streams.get_shard_iterator(StreamArn=arn, ShardId=shard, ShardIteratorType=kind)
        return str(answer["ShardIterator"])

    for n in range(3):
        ddb.put_item(TableName=TABLE, Item={**_key(n), "v": {"S": "old"}})
    old = iterator()
    assert len(streams.get_records(ShardIterator=old)["Records"]) == 3
    time.sleep(SHORT + 0.5)

    ddb.put_item(TableName=TABLE, Item={**_key(9), "v": {"S": "new"}})  # trims the 3 old ones
    records = streams.get_records(ShardIterator=iterator())["Records"]
    assert [r["dynamodb"]["Keys"]["pk"]["S"] for r in records] == ["FACTORY#f0009"]
    with pytest.raises(ClientError) as expired:
        streams.get_records(ShardIterator=old)
    assert expired.value.response["Error"]["Code"] == "ExpiredIteratorException"


# -- transactions: what they touch, not the whole table -----------------------------------------

BIG = 3_000  # items (and stream records) of the table the transactions run on: ~1 KB each
# the heap a transaction of 5 items may need beyond what was resident: a copy of the table and
# its stream would be tens of MB
PEAK_BOUND_KB = 4_096


def _records(streams: Any, arn: str) -> list[dict[str, Any]]:
    shard = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
    iterator = streams.get_shard_iterator(
        StreamArn=arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    records: list[dict[str, Any]] = []
    while True:
        page = streams.get_records(ShardIterator=iterator, Limit=1000)
        if not page["Records"]:
            return records
        records += page["Records"]
        iterator = page["NextShardIterator"]


def test_a_transaction_needs_memory_for_its_items_not_for_the_table(server: MotoServer) -> None:
    ddb, name = _client(server.url, "dynamodb"), "aegis-transact-peak"
    _create_table(ddb, name)
    for first in range(0, BIG, 25):
        ddb.batch_write_item(
            RequestItems={
                name: [
                    {"PutRequest": {"Item": {**_key(n), "reasons": {"S": "r" * 900}}}}
                    for n in range(first, first + 25)
                ]
            }
        )

    def claim(round_: int) -> None:
        ddb.transact_write_items(
            TransactItems=[
                {
                    "Update": {
                        "TableName": name,
                        "Key": _key(round_ * 5 + n),
                        "UpdateExpression": "SET claimed = :r",
                        "ExpressionAttributeValues": {":r": {"N": str(round_)}},
                    }
                }
                for n in range(5)
            ]
        )

    for round_ in range(3):  # warm up
        claim(round_)
    pid = server.process.pid
    before = _rss_kb(pid)
    _reset_peak_rss(pid)
    for round_ in range(3, 23):
        claim(round_)
    peak = _peak_rss_kb(pid)
    assert peak - before < PEAK_BOUND_KB, (
        f"20 transactions of 5 items on a table of {BIG} items raised the emulator's peak "
        f"resident memory {peak - before} KB above the {before} KB resident before them"
    )


def test_a_cancelled_transaction_leaves_its_items_and_the_stream_as_they_were(
    server: MotoServer,
) -> None:
    ddb, streams, name = (
        _client(server.url, "dynamodb"),
        _client(server.url, "dynamodbstreams"),
        "aegis-transact-rollback",
    )
    _create_table(ddb, name)
    arn = ddb.describe_table(TableName=name)["Table"]["LatestStreamArn"]
    ddb.put_item(TableName=name, Item={**_key(1), "v": {"N": "1"}})
    written = _records(streams, arn)

    def transaction(check: dict[str, Any]) -> None:
        ddb.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": name, "Item": {**_key(2), "v": {"N": "1"}}}},
                {
                    "Update": {
                        "TableName": name,
                        "Key": _key(1),
                        "UpdateExpression": "SET v = v + :one",
                        "ExpressionAttributeValues": {":one": {"N": "1"}},
                    }
                },
                {
                    "ConditionCheck": {
                        "TableName": name,
                        "Key": check,
                        "ConditionExpression": "attribute_exists(pk)",
                    }
                },
            ]
        )

    with pytest.raises(ClientError) as cancelled:
        transaction(check=_key(3))  # no such item: the transaction is cancelled
    assert cancelled.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert ddb.get_item(TableName=name, Key=_key(1))["Item"]["v"] == {"N": "1"}
    assert "Item" not in ddb.get_item(TableName=name, Key=_key(2))
    assert _records(streams, arn) == written

    ddb.put_item(TableName=name, Item=_key(3))
    written = _records(streams, arn)
    transaction(check=_key(3))
    assert ddb.get_item(TableName=name, Key=_key(1))["Item"]["v"] == {"N": "2"}
    assert ddb.get_item(TableName=name, Key=_key(2))["Item"]["v"] == {"N": "1"}
    after = _records(streams, arn)
    assert after[: len(written)] == written
    numbers = [int(r["dynamodb"]["SequenceNumber"]) for r in after]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    assert [r["eventName"] for r in after[len(written) :]] == ["INSERT", "MODIFY"]


# -- stream records: what an item's images take, not a dict per attribute -----------------------

UPDATES = 500  # 15 MB at the old ~30 KB a record, against a bound of 4 MB (measured: ~0.7 MB)
# resident memory a write's stream record may add: a LATEST row's two images are ~4 KB of JSON;
# as moto's nested dicts they took ~30 KB; packed, 1.4-1.6 KB
BOUND_KB_PER_RECORD = 8.0


def _latest_row(n: int) -> dict[str, Any]:
    """A LATEST-like row: ~60 attributes, sensors and detections nested."""
    sensors = {f"sensor_{i:02d}": {"N": str(20 + (n + i) % 7)} for i in range(30)}
    detections = [
        {"M": {"label": {"S": "person"}, "confidence": {"N": str(0.5 + i / 100)}}} for i in range(8)
    ]
    row: dict[str, Any] = {**_key(0), "sensors": {"M": sensors}, "detections": {"L": detections}}
    row |= {f"field_{i:02d}": {"S": f"value-{n}-{i}"} for i in range(20)}
    return row


def test_a_stream_record_takes_about_the_size_of_its_images(server: MotoServer) -> None:
    ddb, name = _client(server.url, "dynamodb"), "aegis-stream-records"
    _create_table(ddb, name)
    for n in range(50):  # warm up
        ddb.put_item(TableName=name, Item=_latest_row(n))
    pid = server.process.pid
    before = _rss_kb(pid)
    for n in range(UPDATES):  # each replaces the row: one MODIFY record with both images
        ddb.put_item(TableName=name, Item=_latest_row(n))
    per_record = (_rss_kb(pid) - before) / UPDATES
    print(f"{per_record:.2f} KB of resident memory a stream record")  # shown with -rP
    assert per_record < BOUND_KB_PER_RECORD, (
        f"{UPDATES} writes of one row grew the emulator {per_record:.1f} KB each"
    )
    arn = ddb.describe_table(TableName=name)["Table"]["LatestStreamArn"]
    streams = _client(server.url, "dynamodbstreams")
    records = _records(streams, arn)
    assert len(records) == 50 + UPDATES
    last = records[-1]
    assert last["eventName"] == "MODIFY"
    assert last["dynamodb"]["NewImage"] == _latest_row(UPDATES - 1)
    assert last["dynamodb"]["OldImage"] == _latest_row(UPDATES - 2)
