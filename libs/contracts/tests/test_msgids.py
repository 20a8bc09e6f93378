"""The message ids: each family keeps its prefix and its form, since an id changed between two
versions would let a fact announced by an old and a new replica during a rolling upgrade be
stored twice; no two families share a prefix; and no service builds an id of its own."""

from __future__ import annotations

import re
from pathlib import Path

from aegis_contracts import msgids

ROOT = Path(__file__).resolve().parents[3]


def test_each_family_keeps_its_form() -> None:
    assert msgids.object_created("processed/f/x.json") == "oc:processed/f/x.json"
    assert msgids.object_created("reports/r.md", '"e1"') == 'oc:reports/r.md:"e1"'
    assert msgids.change("FACTORY#f", "LATE#h", "REMOVE", "d1") == "chg:FACTORY#f:LATE#h:REMOVE:d1"
    assert msgids.latest_change("FACTORY#f", "LATEST", "t1") == "chg:FACTORY#f:LATEST:t1"
    assert msgids.alert_sent("ALERT#f", "CRITICAL#CO#OPEN", 3) == "alert:ALERT#f:CRITICAL#CO#OPEN:3"
    assert msgids.orchestration("run-1:notify.1") == "orch:run-1:notify.1"
    assert msgids.dead_letter("ingest", "bad_json", "m-1", "0123456789abcdef99") == (
        "dlq:ingest:bad_json:m-1:0123456789abcdef"
    )
    assert msgids.expiry("T", "shardId-1", "42") == "exp:T:shardId-1:42"
    assert msgids.s3_notification("b", "k/x", "00AB") == "s3:b/k/x:00AB"


def test_no_two_families_share_a_prefix() -> None:
    assert len(set(msgids.PREFIXES)) == len(msgids.PREFIXES)
    assert not any(a != b and a.startswith(b) for a in msgids.PREFIXES for b in msgids.PREFIXES)


def test_no_service_writes_an_id_by_hand() -> None:
    """An id built inline (``msg_id=f"oc:..."``) would escape the two tests above."""
    inline = re.compile(r'f"(' + "|".join(msgids.PREFIXES) + r"):(?!//)")  # not s3:// URLs
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for pattern in ("libs/*/src/**/*.py", "services/*/src/**/*.py")
        for path in ROOT.glob(pattern)
        if path.name != "msgids.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if inline.search(line)
    ]
    assert found == []
