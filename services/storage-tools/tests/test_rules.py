"""The mapping rules without I/O: the two-tier path table row by row, the AEGIS legacy preset, and
rule files."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from aegis_storage_tools.rules import (
    Move,
    Rule,
    RuleError,
    RuleSet,
    Skip,
    TargetClass,
    aegis_legacy,
    datasets_processing,
    load_rules,
    map_key,
)

D = "country=us/category=news/date=2026-01-28"
RAW, DERIVED = TargetClass.RAW, TargetClass.DERIVED

# the path table, old (three tiers) -> new (two tiers): every row, with both .success policies
PATH_TABLE = [
    # row 1: datasets/ -> raw/ (immutable)
    ("prod/", f"datasets/{D}/raw_0001.json", f"raw/{D}/raw_0001.json", RAW),
    # a legacy partition manifest is derived data, and its name is the sealer's: it goes with
    # the checkpoints to prod/
    ("prod/", f"datasets/{D}/raw_metadata.json", f"prod/{D}/raw_metadata.json", DERIVED),
    # row 2: the .success checkpoint: raw/ beside the object, or prod/, by policy
    ("beside", f"datasets/{D}/raw_0001.json.success", f"raw/{D}/raw_0001.json.success", RAW),
    ("prod/", f"datasets/{D}/raw_0001.json.success", f"prod/{D}/raw_0001.json.success", DERIVED),
    # row 3: processing/ domain metadata -> prod/
    (
        "prod/",
        f"processing/{D}/example.com/domain_metadata.json",
        f"prod/{D}/example.com/domain_metadata.json",
        DERIVED,
    ),
    # row 4: robots.txt and sitemap.xml -> prod/
    (
        "prod/",
        f"processing/{D}/example.com/robots.txt",
        f"prod/{D}/example.com/robots.txt",
        DERIVED,
    ),
    (
        "prod/",
        f"processing/{D}/example.com/sitemap.xml",
        f"prod/{D}/example.com/sitemap.xml",
        DERIVED,
    ),
]


@pytest.mark.parametrize(("sidecars", "source", "dest", "cls"), PATH_TABLE)
def test_datasets_processing_path_table(
    sidecars: str, source: str, dest: str, cls: TargetClass
) -> None:
    mapped = map_key(source, datasets_processing(sidecars=sidecars))
    assert isinstance(mapped, Move)
    assert (mapped.dest, mapped.target_class) == (dest, cls)


@pytest.mark.parametrize("sidecars", ["prod/", "beside"])
def test_datasets_processing_prod_stays_where_it_is(sidecars: str) -> None:
    # row 5: final outputs under prod/ stay under prod/ (no rule moves them)
    mapped = map_key(f"prod/{D}/final/summary.json", datasets_processing(sidecars=sidecars))
    assert mapped == Skip(f"prod/{D}/final/summary.json", None, "no_rule")


def test_aegis_legacy_moves_latest_out_of_the_way() -> None:
    mapped = map_key("latest/factory-a/LATEST.json", aegis_legacy())
    assert mapped == Move(
        "latest/factory-a/LATEST.json", "legacy/latest/factory-a/LATEST.json", "latest", DERIVED
    )


def test_aegis_legacy_dates_flat_raw_by_arrival_and_leaves_dated_raw_alone() -> None:
    at = datetime(2026, 11, 30, 23, 59, 59, 999000, tzinfo=UTC)
    flat = "raw/factory-a/factory_state/msg-00000001.json"
    mapped = map_key(flat, aegis_legacy(), at=at)
    assert isinstance(mapped, Move)
    assert mapped.dest == "raw/factory-a/factory_state/yyyy=2026/mm=11/dd=30/msg-00000001.json"
    assert mapped.target_class is RAW
    dated = "raw/factory-a/factory_state/yyyy=2026/mm=11/dd=30/msg-00000001.json"
    assert map_key(dated, aegis_legacy()) == Skip(dated, "flat-raw", "not_flat_legacy")
    odd = "raw/factory-a/factory_state/notes.txt"
    assert isinstance(map_key(odd, aegis_legacy(), at=at), Skip)


def test_rule_file_with_rewrite_and_excludes(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(
        """
[[rule]]
name = "datasets"
source = "datasets/country=us"
target = "raw/country=us"
class = "raw"
exclude = ["*/_tmp/*", "*.crc"]
sidecars = "prod"

[[rule]]
source = "processing/"
target = "prod/"
""",
        encoding="utf-8",
    )
    rules = load_rules(path)
    partition = "country=us/date=2026-01-28"
    assert map_key(f"datasets/{partition}/x.json", rules) == Move(
        f"datasets/{partition}/x.json", f"raw/{partition}/x.json", "datasets", RAW
    )
    assert map_key(f"datasets/{partition}/_tmp/x.json", rules).reason == "excluded"  # type: ignore[union-attr]
    assert map_key(f"datasets/{partition}/x.crc", rules).reason == "excluded"  # type: ignore[union-attr]
    side = map_key(f"datasets/{partition}/x.json.success", rules)
    assert isinstance(side, Move) and side.dest == "prod/date=2026-01-28/x.json.success"
    assert map_key("datasets/country=kr/a/x.json", rules).reason == "no_rule"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "source",
    [
        "datasets/country=us/a/x.json",  # no date= folder
        "datasets/country=us/readme.txt",  # above the partitions
        "datasets/country=us/date=2026-02-30/x.json",  # no such day
        "datasets/country=us/date=2026-01-28",  # an object named like the folder
    ],
)
def test_a_raw_destination_in_no_sealed_partition_is_skipped(source: str) -> None:
    rules = RuleSet((Rule("datasets", "datasets/", "raw/", RAW, sidecars="prod/"),))
    skipped = map_key(source, rules)
    assert isinstance(skipped, Skip) and skipped.reason == "no_partition", skipped


def test_a_legacy_manifest_stays_when_checkpoints_stay_beside() -> None:
    skipped = map_key(
        f"datasets/{D}/raw_metadata.late-0001.json", datasets_processing(sidecars="beside")
    )
    assert isinstance(skipped, Skip) and skipped.reason == "reserved_name"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[[rule]]\nsource = "a/"\ntarget = "raw/a/"\n', "class must be raw"),
        ('[[rule]]\nsource = "a/"\ntarget = "b/"\nclass = "raw"\n', "needs a target under raw/"),
        ('[[rule]]\nsource = "a/"\n', "target is required"),
        ('[[rule]]\nsource = "a/"\ntarget = "b/"\ncolour = "red"\n', "unknown field"),
        ('[[rule]]\nsource = "../a/"\ntarget = "b/"\n', "not a key prefix"),
        ("x = 1\n", "no [[rule]]"),
    ],
)
def test_bad_rule_files_are_refused_with_the_reason(
    tmp_path: Path, body: str, message: str
) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(RuleError, match=message.replace("[", r"\[")):
        load_rules(path)
