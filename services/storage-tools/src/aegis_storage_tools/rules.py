"""Mapping rules of ``aegis migrate``: where each legacy key goes, decided without I/O.

A rule takes the keys under a source prefix to a target prefix (the relative path kept), or, with
``rewrite = "aegis-raw-dated"``, a flat ``{factory_id}/{source_type}/{message_id}.json`` into the
contract's dated raw layout using the object's arrival time. ``class`` says what the target is:
``raw`` (immutable: never overwritten) or ``derived``. Sidecars (``*.success`` checkpoints) follow
the two-tier policy: ``beside`` the object, or under another prefix (``prod/``), since raw/ holds
originals only. Every raw destination lies in a partition the sealer seals (the contract's, or a
dataset partition ``raw/name=value/.../date=YYYY-MM-DD/``): a key that would lie in none is
skipped (``no_partition``), and so is a legacy ``raw_metadata*.json`` (the sealer's names), which
goes where the sidecars go when that is a prefix (``reserved_name`` when they stay beside). Rules
come from a TOML file or a preset (``datasets-processing``, ``aegis-legacy``).
"""

from __future__ import annotations

import fnmatch
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from aegis_contracts.errors import ContractError
from aegis_contracts.keys import RAW_PREFIX, raw_key
from aegis_contracts.seal import is_seal_name
from aegis_storage_tools.seal import partition_of

BESIDE = "beside"
DEFAULT_SIDECARS = ("*.success",)


class TargetClass(StrEnum):
    RAW = "raw"  # immutable originals: an existing object is never overwritten
    DERIVED = "derived"


class Rewrite(StrEnum):
    PREFIX = "prefix"
    AEGIS_RAW_DATED = "aegis-raw-dated"


class RuleError(ValueError):
    """A rule file or preset that cannot be used; the message names the rule and the field."""


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    source: str
    target: str
    target_class: TargetClass = TargetClass.DERIVED
    rewrite: Rewrite = Rewrite.PREFIX
    exclude: tuple[str, ...] = ()
    sidecar_patterns: tuple[str, ...] = DEFAULT_SIDECARS
    sidecars: str = BESIDE  # BESIDE, or a prefix the sidecar's relative path goes under

    @property
    def needs_time(self) -> bool:
        """The destination depends on the object's arrival time (a HEAD per object)."""
        return self.rewrite is Rewrite.AEGIS_RAW_DATED


@dataclass(frozen=True, slots=True)
class Move:
    source: str
    dest: str
    rule: str
    target_class: TargetClass
    sidecar: bool = False


@dataclass(frozen=True, slots=True)
class Skip:
    source: str
    rule: str | None
    reason: str  # excluded | in_place | not_flat_legacy | no_rule | no_partition | reserved_name


@dataclass(frozen=True, slots=True)
class RuleSet:
    rules: tuple[Rule, ...]
    name: str = "rules"
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def source_prefixes(self) -> list[str]:
        return sorted({r.source for r in self.rules})

    def rule_for(self, key: str) -> Rule | None:
        """The rule with the longest source prefix that ``key`` starts with."""
        found = [r for r in self.rules if key.startswith(r.source)]
        return max(found, key=lambda r: len(r.source)) if found else None


def map_key(key: str, rules: RuleSet, *, at: datetime | None = None) -> Move | Skip:
    """Where ``key`` goes. ``at`` (the object's arrival time) is needed by dated rewrites."""
    rule = rules.rule_for(key)
    if rule is None:
        return Skip(key, None, "no_rule")
    rel = key[len(rule.source) :]
    if any(fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(key, p) for p in rule.exclude):
        return Skip(key, rule.name, "excluded")
    sidecar = any(fnmatch.fnmatchcase(rel, p) for p in rule.sidecar_patterns)
    if sidecar and rule.sidecars != BESIDE:
        return _move(key, f"{rule.sidecars}{rel}", rule, TargetClass.DERIVED, sidecar=True)
    if rule.rewrite is Rewrite.AEGIS_RAW_DATED:
        return _dated(key, rel, rule, at)
    if rule.target_class is TargetClass.RAW and is_seal_name(rel.rsplit("/", 1)[-1]):
        return _legacy_manifest(key, rel, rule)
    return _move(key, f"{rule.target}{rel}", rule, rule.target_class, sidecar=sidecar)


def _legacy_manifest(key: str, rel: str, rule: Rule) -> Move | Skip:
    """A legacy system's own partition manifest: derived data, and its name is the sealer's."""
    if rule.sidecars == BESIDE:
        return Skip(key, rule.name, "reserved_name")
    return _move(key, f"{rule.sidecars}{rel}", rule, TargetClass.DERIVED, sidecar=True)


def _move(key: str, dest: str, rule: Rule, cls: TargetClass, *, sidecar: bool) -> Move | Skip:
    if dest == key:
        return Skip(key, rule.name, "in_place")
    if cls is TargetClass.RAW and partition_of(dest) is None:
        # raw/ holds partitions only, each sealed and audited: a key in none would be neither
        return Skip(key, rule.name, "no_partition")
    return Move(key, dest, rule.name, cls, sidecar)


def _dated(key: str, rel: str, rule: Rule, at: datetime | None) -> Move | Skip:
    parts = rel.split("/")
    if len(parts) != 3 or not parts[2].endswith(".json"):
        return Skip(key, rule.name, "not_flat_legacy")  # already dated, or something else
    if at is None:
        raise ValueError(f"rule {rule.name!r} needs the arrival time of {key}")
    try:
        dest = raw_key(parts[0], parts[1], at, parts[2].removesuffix(".json"))
    except ContractError:
        return Skip(key, rule.name, "not_flat_legacy")
    if not rule.target.startswith(RAW_PREFIX):  # the dated layout is the raw contract's
        dest = rule.target + dest.removeprefix(RAW_PREFIX)
    return _move(key, dest, rule, rule.target_class, sidecar=False)


# -- presets and rule files -------------------------------------------------------------------


def datasets_processing(*, sidecars: str = "prod/") -> RuleSet:
    """The two-tier move: datasets/ -> raw/ (immutable), processing/ -> prod/; prod/ stays.
    ``.success`` checkpoints go to prod/ by default (raw/ keeps originals only) or ``beside``."""
    return RuleSet(
        (
            Rule("datasets", "datasets/", "raw/", TargetClass.RAW, sidecars=sidecars),
            Rule("processing", "processing/", "prod/", TargetClass.DERIVED),
        ),
        name="datasets-processing",
    )


def aegis_legacy() -> RuleSet:
    """AEGIS's own legacy: ``latest/`` copies (nothing reads them) out of the way under
    ``legacy/latest/``; flat ``raw/{f}/{source_type}/{id}.json`` into the dated raw layout."""
    return RuleSet(
        (
            Rule("latest", "latest/", "legacy/latest/", TargetClass.DERIVED, sidecar_patterns=()),
            Rule(
                "flat-raw",
                "raw/",
                "raw/",
                TargetClass.RAW,
                rewrite=Rewrite.AEGIS_RAW_DATED,
                sidecar_patterns=(),
            ),
        ),
        name="aegis-legacy",
    )


PRESETS = {"datasets-processing": datasets_processing, "aegis-legacy": aegis_legacy}


def preset(name: str, *, sidecars: str | None = None) -> RuleSet:
    if name == "datasets-processing":
        return datasets_processing(sidecars=sidecars or "prod/")
    if name == "aegis-legacy":
        return aegis_legacy()
    raise RuleError(f"no preset {name!r}; presets: {', '.join(PRESETS)}")


def load_rules(path: Path) -> RuleSet:
    """Rules from a TOML file: ``[[rule]]`` tables with name, source, target, class, rewrite,
    exclude, sidecar_patterns, sidecars."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise RuleError(f"{path}: {err}") from None
    tables = doc.get("rule")
    if not isinstance(tables, list) or not tables:
        raise RuleError(f"{path}: no [[rule]] tables")
    return RuleSet(tuple(parse_rule(t, i) for i, t in enumerate(tables, 1)), name=str(path))


_FIELDS = {
    "name",
    "source",
    "target",
    "class",
    "rewrite",
    "exclude",
    "sidecar_patterns",
    "sidecars",
}


def parse_rule(table: Mapping[str, Any], number: int = 1) -> Rule:
    name = str(table.get("name") or f"rule-{number}")
    unknown = set(table) - _FIELDS
    if unknown:
        raise RuleError(f"rule {name!r}: unknown field(s) {sorted(unknown)}")
    try:
        source, target = _prefix(table["source"]), _prefix(table["target"])
        rule = Rule(
            name=name,
            source=source,
            target=target,
            target_class=TargetClass(table.get("class", "derived")),
            rewrite=Rewrite(table.get("rewrite", "prefix")),
            exclude=_strings(table.get("exclude", ())),
            sidecar_patterns=_strings(table.get("sidecar_patterns", DEFAULT_SIDECARS)),
            sidecars=table.get("sidecars", BESIDE)
            if table.get("sidecars", BESIDE) == BESIDE
            else _prefix(table["sidecars"]),
        )
    except KeyError as err:
        raise RuleError(f"rule {name!r}: {err.args[0]} is required") from None
    except (ValueError, TypeError) as err:
        raise RuleError(f"rule {name!r}: {err}") from None
    if rule.target.startswith(RAW_PREFIX) and rule.target_class is not TargetClass.RAW:
        raise RuleError(f"rule {name!r}: a target under raw/ is immutable: class must be raw")
    if rule.target_class is TargetClass.RAW and not rule.target.startswith(RAW_PREFIX):
        raise RuleError(f"rule {name!r}: class raw needs a target under raw/")
    return rule


def _prefix(value: object) -> str:
    if not isinstance(value, str) or not value or value.startswith("/") or ".." in value:
        raise ValueError(f"{value!r} is not a key prefix")
    return value if value.endswith("/") else f"{value}/"


def _strings(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise TypeError(f"{value!r} is not a list of patterns")
    return tuple(str(v) for v in value)


def describe(rules: Sequence[Rule]) -> list[str]:
    return [
        f"{r.name}: {r.source} -> {r.target} ({r.target_class.value}, {r.rewrite.value})"
        for r in rules
    ]


# -- what the storage-tools role may delete ------------------------------------------------------
#
# Whether a run can delete (or purge the versions of) a rule's sources is decided here, from a
# table, not by evaluating the policy documents at run time. The documents (deploy/infra: the
# role's identity policy and the bucket policy) are CloudFormation sources: they are not in the
# image, and their ARNs hold placeholders (account, NamePrefix) that a running tool cannot
# resolve. Evaluating them would also take a second implementation of IAM's grammar (conditions,
# principals, NotAction) in production code. The decision itself is small and a matter of
# prefixes, so it ships as data, and a test (tests/test_role_deletes.py) evaluates the shipped
# documents for the storage-tools role with the emulator's IAM evaluator over every preset's
# sources and both sides of every prefix in the table: changing the policies without the table
# (or the reverse) fails it. S3 still has the last word: a delete the table allowed and the bucket
# refused is a failed key in the journal, never a lost object.

DELETE_OBJECT = "s3:DeleteObject"
DELETE_OBJECT_VERSION = "s3:DeleteObjectVersion"
# IAM action -> the key prefixes under which the shipped policies refuse it to the storage-tools
# role (everywhere else they allow it): raw/ deletes are the raw break-glass role's alone
ROLE_REFUSED: Mapping[str, tuple[str, ...]] = {
    DELETE_OBJECT: (RAW_PREFIX,),
    DELETE_OBJECT_VERSION: (RAW_PREFIX,),
}
BREAK_GLASS = "the raw break-glass role"


class Deletes(StrEnum):
    """Whether the storage-tools role may delete the keys under a rule's source."""

    YES = "yes"
    NO = "no"  # the source lies under a refused prefix
    PARTLY = "partly"  # a refused prefix lies under the source: its keys there are refused


def role_may(action: str, key: str) -> bool:
    """May the storage-tools role do ``action`` (a key in :data:`ROLE_REFUSED`) on ``key``?"""
    return not any(key.startswith(prefix) for prefix in ROLE_REFUSED[action])


def source_deletes(rule: Rule, action: str = DELETE_OBJECT) -> Deletes:
    """Whether the storage-tools role may do ``action`` on the keys under ``rule.source``."""
    refused = ROLE_REFUSED[action]
    if any(rule.source.startswith(prefix) for prefix in refused):
        return Deletes.NO
    if any(prefix.startswith(rule.source) for prefix in refused):
        return Deletes.PARTLY
    return Deletes.YES


def refused_reason(key: str, action: str = DELETE_OBJECT) -> str:
    """Why the storage-tools role may not do ``action`` on ``key`` (for messages)."""
    [prefix] = [p for p in ROLE_REFUSED[action] if key.startswith(p)][:1] or ["?"]
    return (
        f"the bucket and role policies refuse {action} under {prefix} to every role but "
        f"{BREAK_GLASS}"
    )
