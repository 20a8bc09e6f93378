"""READ_MODEL_QUERY from task conditions (search and sort specs): a pure :class:`QuerySpec`
built from a step's conditions and resolved params, and the DynamoDB query it becomes.

The query reads what it can return: conditions on the sort key (``sk``, and the ``sk_prefix``
param) become the key condition, a range of the partition; equality and existence conditions
become a filter; the ``fields`` param becomes a projection; with no sort but the sort key's,
reading stops once ``limit`` items passed. What DynamoDB cannot decide exactly as the conditions
mean (a comparison across types, a CONTAINS) it is not asked: every pushed-down part selects
a superset of the answer, and :meth:`QuerySpec.apply` then decides each item exactly.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from aegis_orchestration.model import TaskCondition

_MISSING = object()
SORT_KEY = "sk"
# the sort key conditions DynamoDB can hold in a key condition (as a range)
_LOWER = {"GT", "GE"}
_UPPER = {"LT", "LE"}
MAX_LIMIT = 1000
# the key condition of a query no item can answer (its range is empty): nothing is read
EMPTY = "EMPTY"


@dataclass(frozen=True, slots=True)
class Clause:
    field: str
    comparison: str
    value: Any
    operator: str  # how it joins the clauses before it: AND / OR


@dataclass(frozen=True, slots=True)
class DynamoQuery:
    """One partition's Query: ``key_condition`` on ``sk`` only (the caller adds ``pk``), a
    ``filter``, both over ``names`` and plain ``values``; ``projection`` document paths (None:
    whole items); ``forward`` the sort key's order; ``stops_early``: the first ``limit`` items
    that :meth:`QuerySpec.apply` keeps, in the order read, are the answer."""

    key_condition: str | None
    filter: str | None
    names: dict[str, str] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    projection: tuple[str, ...] | None = None
    forward: bool = True
    stops_early: bool = False


@dataclass(frozen=True, slots=True)
class QuerySpec:
    pk: str
    sk_prefix: str
    clauses: tuple[Clause, ...]
    sort: tuple[tuple[str, bool], ...]  # (field, descending) by priority
    limit: int
    fields: tuple[str, ...] = ()  # what each answer item holds (empty: all of it)

    def apply(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        found = [i for i in items if str(i.get("sk", "")).startswith(self.sk_prefix)]
        found = [i for i in found if self.matches(i)]
        for name, descending in reversed(self.sort):  # stable sorts, least significant first
            found.sort(key=functools.partial(_sort_key, name), reverse=descending)
        return [self.shape(i) for i in found[: self.limit]]

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

    def shape(self, item: Mapping[str, Any]) -> dict[str, Any]:
        """The item as the answer holds it: the ``fields`` asked for, or all of it."""
        if not self.fields:
            return dict(item)
        out: dict[str, Any] = {}
        for path in self.fields:
            value = _field(item, path)
            if value is _MISSING:
                continue
            target = out
            *parents, last = path.split(".")
            for part in parents:
                target = target.setdefault(part, {})
            target[last] = value
        return out

    def plan(self) -> DynamoQuery:
        """The DynamoDB query that reads this spec's answer (see the module's docstring)."""
        names: dict[str, str] = {}
        values: dict[str, Any] = {}

        def name(path: str) -> str:
            parts = []
            for part in path.split("."):
                placeholder = next((k for k, v in names.items() if v == part), None)
                if placeholder is None:
                    placeholder = f"#n{len(names)}"
                    names[placeholder] = part
                parts.append(placeholder)
            return ".".join(parts)

        def value(v: Any) -> str:
            placeholder = f":v{len(values)}"
            values[placeholder] = v
            return placeholder

        key_condition = self._key_condition(value)
        filter_expression = self._filter(name, value)
        projection = None
        if self.fields:
            wanted = {*self.fields, SORT_KEY, "pk", "ttl"}
            wanted |= {c.field for c in self.clauses} | {s for s, _ in self.sort}
            projection = tuple(name(p) for p in _outermost(wanted))
        by_sort_key_only = all(s == SORT_KEY for s, _ in self.sort)
        return DynamoQuery(
            key_condition=key_condition,
            filter=filter_expression,
            names=names,
            values=values,
            projection=projection,
            forward=not (self.sort and self.sort[0][1]),
            stops_early=by_sort_key_only,
        )

    def _key_condition(self, value: Any) -> str | None:
        """The narrowest range of sort keys that holds every answer (``EMPTY`` when none can
        hold one)."""
        equal, lo, hi = self._sk_bounds()
        if equal is not None:
            return f"sk = {value(equal)}"
        if lo is not None and hi is not None:
            if lo > hi:
                return EMPTY
            if self.sk_prefix and lo == self.sk_prefix and _after_prefix(lo) == [hi]:
                return f"begins_with(sk, {value(lo)})"
            return f"sk BETWEEN {value(lo)} AND {value(hi)}"
        if lo is not None or hi is not None:
            return f"sk >= {value(lo)}" if lo is not None else f"sk <= {value(hi)}"
        return None

    def _sk_bounds(self) -> tuple[str | None, str | None, str | None]:
        """(equal, lowest, highest) sort key an answer can have, from ``sk_prefix`` and the
        conditions on ``sk`` when every condition must hold (no OR); bounds inclusive."""
        lower: list[str] = [self.sk_prefix] if self.sk_prefix else []
        upper: list[str] = _after_prefix(self.sk_prefix)
        equal: list[str] = []
        anded = all(c.operator == "AND" for c in self.clauses[1:])
        for c in self.clauses if anded else ():
            if c.field != SORT_KEY or not _plain_text(c.value):
                continue
            want = str(c.value)
            if c.comparison == "EQ":
                equal.append(want)
            elif c.comparison in _LOWER:
                lower.append(want)  # GT read as GE: apply() drops the equal one
            elif c.comparison in _UPPER:
                upper.append(want)
            elif c.comparison == "BEGINS_WITH":
                lower.append(want)
                upper.extend(_after_prefix(want))
        return (
            equal[0] if equal else None,
            max(lower) if lower else None,
            min(upper) if upper else None,
        )

    def _filter(self, name: Any, value: Any) -> str | None:
        """The clauses as a filter in which a clause DynamoDB cannot decide exactly holds (so
        the filter keeps every item the clauses keep, and maybe more). Combined as
        :meth:`matches` combines them, left to right; rendered only once known to be needed,
        since DynamoDB refuses names and values an expression does not use."""
        tree: Any = None  # None: holds for every item
        for n, clause in enumerate(self.clauses):
            leaf = clause if _pushable(clause) else None
            if n == 0:
                tree = leaf
            elif clause.operator == "OR":
                tree = None if tree is None or leaf is None else ("OR", tree, leaf)
            elif leaf is not None:
                tree = leaf if tree is None else ("AND", tree, leaf)

        def render(node: Any) -> str:
            if isinstance(node, Clause):
                return _pushed_down(node, name, value)
            op, left, right = node
            return f"({render(left)}) {op} ({render(right)})"

        return None if tree is None else render(tree)


def _plain_text(value: Any) -> bool:
    """A string compared as a string: not one a comparison would read as a number."""
    if not isinstance(value, str):
        return False
    try:
        float(value)
    except ValueError:
        return True
    return False


def _after_prefix(prefix: str) -> list[str]:
    """A string greater than every string that begins with ``prefix`` (its last character
    moved on by one): the upper end of an inclusive range of that prefix (none for a prefix
    ending in the last code point)."""
    if not prefix or ord(prefix[-1]) >= 0x10FFFF:
        return []
    return [prefix[:-1] + chr(ord(prefix[-1]) + 1)]


def _outermost(paths: set[str]) -> list[str]:
    """``paths`` without those inside another (DynamoDB refuses overlapping projections)."""
    return sorted(
        p for p in paths if not any(p.startswith(f"{other}.") for other in paths if other != p)
    )


def _pushable(clause: Clause) -> bool:
    """Whether DynamoDB's typed comparison keeps every item the clause keeps."""
    return clause.comparison == "EXISTS" or (
        clause.comparison == "EQ" and bool(_equal_forms(clause.value))
    )


def _pushed_down(clause: Clause, name: Any, value: Any) -> str:
    """A :func:`_pushable` clause as a filter."""
    path = name(clause.field)
    if clause.comparison == "EXISTS":
        return f"attribute_exists({path})"
    return " OR ".join(f"{path} = {value(form)}" for form in _equal_forms(clause.value))


def _equal_forms(want: Any) -> list[Any]:
    """Every stored value EQ holds for (``value == want or str(value) == str(want)``), by type."""
    if isinstance(want, bool):
        return [want, int(want), str(want)]
    if isinstance(want, int | float):
        if not math.isfinite(want):
            return []
        forms: list[Any] = [Decimal(str(want)), str(want)]
        if want in (0, 1):
            forms.append(bool(want))
        return forms
    if isinstance(want, str) and want and want[0] not in "{[":
        forms = [want]
        try:
            number = Decimal(want)
        except ArithmeticError:
            number = None
        if number is not None and number.is_finite():
            forms.append(number)
            if number in (0, 1):
                forms.append(bool(number))
        if want in ("True", "False"):
            forms.append(want == "True")
        return forms
    return []


def build_query(conditions: list[TaskCondition], params: Mapping[str, Any]) -> QuerySpec:
    """``params`` gives ``pk`` (required), ``sk_prefix``, ``limit`` and ``fields`` (a list of
    attribute paths, or one comma-separated string); conditions the rest. A condition's field is
    ``field_id``, or ``field_id.sub_key`` with a ``sub_key``. A PARAM_KEY condition takes its
    value from ``params[value]``."""
    pk = params.get("pk")
    if not isinstance(pk, str) or not pk:
        raise ValueError("READ_MODEL_QUERY needs a pk param")
    clauses: list[Clause] = []
    sort: list[tuple[int, str, bool]] = []
    for c in sorted(conditions, key=lambda c: (c.condition_index or 0, c.priority, c.id)):
        path = f"{c.field_id}.{c.sub_key}" if c.sub_key else c.field_id
        if c.condition_type == "SORT":
            sort.append((c.priority, path, c.comparison_type == "DESC"))
            continue
        value = params.get(str(c.value), None) if c.value_type == "PARAM_KEY" else c.value
        clauses.append(Clause(path, c.comparison_type, value, c.operator_type))
    limit = int(params.get("limit", 100))
    return QuerySpec(
        pk=pk,
        sk_prefix=str(params.get("sk_prefix", "")),
        clauses=tuple(clauses),
        sort=tuple((name, desc) for _, name, desc in sorted(sort)),
        limit=max(1, min(limit, MAX_LIMIT)),
        fields=_fields(params.get("fields")),
    )


def _fields(given: Any) -> tuple[str, ...]:
    if given is None or given == "":
        return ()
    names = given.split(",") if isinstance(given, str) else given
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise ValueError("READ_MODEL_QUERY's fields param is a list of attribute names")
    found = tuple(n.strip() for n in names if n.strip())
    if any(not part for n in found for part in n.split(".")):
        raise ValueError(f"READ_MODEL_QUERY's fields param has an empty name: {given!r}")
    return found


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
