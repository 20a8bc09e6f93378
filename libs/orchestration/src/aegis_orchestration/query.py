"""READ_MODEL_QUERY from task conditions (search and sort specs): a pure
:class:`QuerySpec` built from a step's conditions and resolved params, applied to the items of one
read-model partition (the service reads ``pk``, this module filters and sorts)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aegis_orchestration.model import TaskCondition

_MISSING = object()


@dataclass(frozen=True, slots=True)
class Clause:
    field: str
    comparison: str
    value: Any
    operator: str  # how it joins the clauses before it: AND / OR


@dataclass(frozen=True, slots=True)
class QuerySpec:
    pk: str
    sk_prefix: str
    clauses: tuple[Clause, ...]
    sort: tuple[tuple[str, bool], ...]  # (field, descending) by priority
    limit: int

    def apply(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        found = [i for i in items if str(i.get("sk", "")).startswith(self.sk_prefix)]
        found = [i for i in found if self.matches(i)]
        for name, descending in reversed(self.sort):  # stable sorts, least significant first
            found.sort(key=functools.partial(_sort_key, name), reverse=descending)
        return found[: self.limit]

    def matches(self, item: Mapping[str, Any]) -> bool:
        result: bool | None = None
        for clause in self.clauses:
            held = _holds(clause, item)
            if result is None:
                result = held
            elif clause.operator == "OR":
                result = result or held
            else:
                result = result and held
        return True if result is None else result


def build_query(conditions: list[TaskCondition], params: Mapping[str, Any]) -> QuerySpec:
    """``params`` gives ``pk`` (required), ``sk_prefix`` and ``limit``; conditions the rest.
    A PARAM_KEY condition takes its value from ``params[value]``."""
    pk = params.get("pk")
    if not isinstance(pk, str) or not pk:
        raise ValueError("READ_MODEL_QUERY needs a pk param")
    clauses: list[Clause] = []
    sort: list[tuple[int, str, bool]] = []
    for c in sorted(conditions, key=lambda c: (c.condition_index or 0, c.priority, c.id)):
        if c.condition_type == "SORT":
            sort.append((c.priority, c.field_id, c.comparison_type == "DESC"))
            continue
        value = params.get(str(c.value), None) if c.value_type == "PARAM_KEY" else c.value
        clauses.append(Clause(c.field_id, c.comparison_type, value, c.operator_type))
    limit = int(params.get("limit", 100))
    return QuerySpec(
        pk=pk,
        sk_prefix=str(params.get("sk_prefix", "")),
        clauses=tuple(clauses),
        sort=tuple((name, desc) for _, name, desc in sorted(sort)),
        limit=max(1, min(limit, 1000)),
    )


def _field(item: Mapping[str, Any], path: str) -> Any:
    value: Any = item
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _holds(clause: Clause, item: Mapping[str, Any]) -> bool:  # noqa: PLR0911
    value = _field(item, clause.field)
    if clause.comparison == "EXISTS":
        return value is not _MISSING and value is not None
    if value is _MISSING or value is None:
        return False
    want = clause.value
    try:
        match clause.comparison:
            case "EQ":
                return bool(value == want or str(value) == str(want))
            case "NE":
                return not (value == want or str(value) == str(want))
            case "BEGINS_WITH":
                return str(value).startswith(str(want))
            case "CONTAINS":
                return str(want) in str(value) if not isinstance(value, list) else want in value
            case "GT":
                return bool(_comparable(value) > _comparable(want))
            case "GE":
                return bool(_comparable(value) >= _comparable(want))
            case "LT":
                return bool(_comparable(value) < _comparable(want))
            case "LE":
                return bool(_comparable(value) <= _comparable(want))
    except TypeError:
        return False
    return False


def _comparable(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def _sort_key(name: str, item: Mapping[str, Any]) -> tuple[int, Any]:
    value = _field(item, name)
    if value is _MISSING or value is None:
        return (0, "")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (1, float(value))
    return (2, str(value))
