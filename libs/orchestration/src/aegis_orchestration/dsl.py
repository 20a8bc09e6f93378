"""The trigger condition DSL: a grammar, a compiler to typed nodes, an evaluator.

    AND(StringMatches(Array([$.beforeData], [@.Q_NAME]), "*S10*"))
    AND(StringEQ([$.busobjectid], "target_object_id"))
    OR(NumberGE([$.afterData.risk.score], 70), NOT(Exists([$.afterData.risk])))

Grammar (lark, LALR): an expression is a call ``Name(arg, ...)``, a JSONPath reference in brackets
(``[$.a.b]`` from the event, ``[@.sub]`` relative to an array element), a string, a number, or
``true``/``false``/``null``. Functions:

- logic: ``AND(c, ...)``, ``OR(c, ...)``, ``NOT(c)``;
- ``StringEQ``/``StringNE``/``StringMatches`` (``*`` any run, ``?`` one character)/``StringContains``;
- ``NumberEQ|NE|GT|GE|LT|LE`` and ``TimestampEQ|NE|GT|GE|LT|LE`` (ISO-8601, compared as instants);
- ``Exists(value)``: the reference resolves to something other than null;
- ``Array([$.path], [@.sub])``: the values of ``@.sub`` in every element of the array(s) at
  ``$.path`` (a value, used inside a comparison).

A reference may resolve to several values (wildcards, arrays): a comparison holds if it holds for
any pair ("any" semantics). Evaluation never raises: missing data, a wrong type or an unparsable
timestamp is simply false. Syntax and arity errors raise :class:`ConditionSyntaxError` naming the
line and column.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from jsonpath_ng import JSONPath
from jsonpath_ng.exceptions import JsonPathLexerError, JsonPathParserError
from jsonpath_ng.parser import parse as parse_jsonpath
from lark import Lark, Token, Tree, UnexpectedInput

GRAMMAR = r"""
?start: expr

?expr: call
     | PATH            -> path
     | ESCAPED_STRING  -> string
     | SIGNED_NUMBER   -> number
     | "true"          -> true
     | "false"         -> false
     | "null"          -> null

call: NAME "(" [expr ("," expr)*] ")"

PATH: /\[\s*[$@](?:[^\[\]]|\[[^\[\]]*\])*\]/
NAME: /[A-Za-z_][A-Za-z0-9_]*/

%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
"""

MAX_LENGTH = 8192


@lru_cache(maxsize=1)
def _parser() -> Lark:
    """Built on the first expression parsed, not at import: a service or command that never
    reads a workflow's condition does not pay for the parser's tables at start."""
    return Lark(GRAMMAR, parser="lalr", propagate_positions=True, maybe_placeholders=False)


class ConditionSyntaxError(ValueError):
    """An expression that is not in the language, with where: ``line``, ``column`` (1-based)."""

    def __init__(self, message: str, text: str, line: int, column: int) -> None:
        lines = text.splitlines() or [""]
        excerpt = lines[line - 1] if 0 < line <= len(lines) else ""
        super().__init__(
            f"{message} at line {line}, column {column}\n  {excerpt}\n  {' ' * (column - 1)}^"
        )
        self.message = message
        self.line = line
        self.column = column


# -- typed nodes -------------------------------------------------------------------------------

Values = list[Any]


class Value:
    """Something that yields candidate values from the event."""

    def values(self, root: Any, here: Any) -> Values:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Literal(Value):
    value: Any

    def values(self, root: Any, here: Any) -> Values:
        return [self.value]


@dataclass(frozen=True, slots=True)
class Ref(Value):
    """A JSONPath reference: ``$`` is the event, ``@`` the current array element."""

    text: str
    relative: bool
    path: JSONPath

    def values(self, root: Any, here: Any) -> Values:
        target = here if self.relative else root
        if target is None:
            return []
        try:
            return [m.value for m in self.path.find(target)]
        except (TypeError, AttributeError, KeyError, IndexError):
            return []


@dataclass(frozen=True, slots=True)
class ArrayValues(Value):
    """``Array([$.path], [@.sub])``: ``sub`` of every element of the array(s) at ``path``."""

    array: Ref
    sub: Ref

    def values(self, root: Any, here: Any) -> Values:
        found: Values = []
        for container in self.array.values(root, here):
            items = container if isinstance(container, list) else [container]
            for item in items:
                found.extend(self.sub.values(root, item))
        return found


class Condition:
    def holds(self, root: Any, here: Any = None) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, event: Mapping[str, Any]) -> bool:
        """Evaluate against an event; never raises."""
        try:
            return self.holds(event)
        except Exception:
            return False


@dataclass(frozen=True, slots=True)
class All(Condition):
    parts: tuple[Condition, ...]

    def holds(self, root: Any, here: Any = None) -> bool:
        return all(p.holds(root, here) for p in self.parts)


@dataclass(frozen=True, slots=True)
class Any_(Condition):
    parts: tuple[Condition, ...]

    def holds(self, root: Any, here: Any = None) -> bool:
        return any(p.holds(root, here) for p in self.parts)


@dataclass(frozen=True, slots=True)
class Not(Condition):
    part: Condition

    def holds(self, root: Any, here: Any = None) -> bool:
        return not self.part.holds(root, here)


@dataclass(frozen=True, slots=True)
class Exists(Condition):
    value: Value

    def holds(self, root: Any, here: Any = None) -> bool:
        return any(v is not None for v in self.value.values(root, here))


@dataclass(frozen=True, slots=True)
class Compare(Condition):
    """``left`` against ``right`` with ``test`` after ``coerce`` (None: not comparable)."""

    name: str
    left: Value
    right: Value
    coerce: Callable[[Any], Any]
    test: Callable[[Any, Any], bool]

    def holds(self, root: Any, here: Any = None) -> bool:
        rights = [r for r in map(self.coerce, self.right.values(root, here)) if r is not None]
        if not rights:
            return False
        for raw in self.left.values(root, here):
            left = self.coerce(raw)
            if left is not None and any(self.test(left, r) for r in rights):
                return True
        return False


# -- coercions and tests -------------------------------------------------------------------------


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _timestamp(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@lru_cache(maxsize=4096)
def wildcard(pattern: str) -> re.Pattern[str]:
    """``*`` any run of characters, ``?`` one; everything else literal; the whole string."""
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile("".join(parts), re.DOTALL)


_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "EQ": lambda a, b: bool(a == b),
    "NE": lambda a, b: bool(a != b),
    "GT": lambda a, b: bool(a > b),
    "GE": lambda a, b: bool(a >= b),
    "LT": lambda a, b: bool(a < b),
    "LE": lambda a, b: bool(a <= b),
}
_STRING: dict[str, Callable[[Any, Any], bool]] = {
    "StringEQ": _ORDER["EQ"],
    "StringNE": _ORDER["NE"],
    "StringMatches": lambda s, p: wildcard(p).fullmatch(s) is not None,
    "StringContains": lambda s, part: part in s,
}
COMPARISONS: dict[str, tuple[Callable[[Any], Any], Callable[[Any, Any], bool]]] = {
    **{name: (_string, test) for name, test in _STRING.items()},
    **{f"Number{op}": (_number, test) for op, test in _ORDER.items()},
    **{f"Timestamp{op}": (_timestamp, test) for op, test in _ORDER.items()},
}
FUNCTIONS = frozenset({"AND", "OR", "NOT", "Exists", "Array", *COMPARISONS})


# -- compiling -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Expression:
    """A compiled condition and its source text."""

    text: str
    condition: Condition

    def __call__(self, event: Mapping[str, Any]) -> bool:
        return self.condition(event)


def parse(text: str) -> Expression:
    """Compile ``text``; raises :class:`ConditionSyntaxError` with the position of the fault."""
    if not isinstance(text, str):
        raise ConditionSyntaxError("an expression must be text", "", 1, 1)
    if len(text) > MAX_LENGTH:
        raise ConditionSyntaxError(f"longer than {MAX_LENGTH} characters", text, 1, MAX_LENGTH)
    if not text.strip():
        raise ConditionSyntaxError("empty expression", text, 1, 1)
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as err:
        line, column = err.line, err.column
        if getattr(getattr(err, "token", None), "type", "") == "$END":
            # the input ended too soon: point just past its last character
            lines = text.splitlines() or [""]
            line, column = len(lines), len(lines[-1]) + 1
        raise ConditionSyntaxError(_describe(err), text, line, column) from None
    return Expression(text, _Compiler(text).condition(tree))


def _describe(err: UnexpectedInput) -> str:
    token = getattr(err, "token", None)
    expected = sorted(getattr(err, "expected", None) or getattr(err, "allowed", None) or [])
    names = {"RPAR": "')'", "LPAR": "'('", "COMMA": "','", "$END": "the end"}
    wanted = ", ".join(names.get(e, e) for e in expected[:6])
    if token is not None and getattr(token, "type", "") == "$END":
        return f"unexpected end of expression (expected {wanted})"
    if token is not None:
        return f"unexpected {str(token)!r}" + (f" (expected {wanted})" if wanted else "")
    char = getattr(err, "char", None)
    return f"unexpected character {char!r}" if char else "syntax error"


class _Compiler:
    def __init__(self, text: str) -> None:
        self.text = text

    def fail(self, node: Tree[Token] | Token, message: str) -> ConditionSyntaxError:
        if isinstance(node, Token):
            line, column = node.line or 1, node.column or 1
        else:
            line, column = node.meta.line, node.meta.column
        return ConditionSyntaxError(message, self.text, line, column)

    def condition(self, node: Tree[Token] | Token) -> Condition:
        if not (isinstance(node, Tree) and node.data == "call"):
            raise self.fail(node, "expected a condition such as AND(...) or StringEQ(...)")
        name_token, *args = node.children
        name = str(name_token)
        if name not in FUNCTIONS:
            raise self.fail(name_token, f"unknown function {name!r}")
        if name in ("AND", "OR"):
            if not args:
                raise self.fail(name_token, f"{name} needs at least one condition")
            parts = tuple(self.condition(a) for a in args)
            return All(parts) if name == "AND" else Any_(parts)
        if name == "NOT":
            self.arity(name_token, args, 1)
            return Not(self.condition(args[0]))
        if name == "Exists":
            self.arity(name_token, args, 1)
            return Exists(self.value(args[0]))
        if name == "Array":
            raise self.fail(name_token, "Array(...) is a value: use it inside a comparison")
        self.arity(name_token, args, 2)
        coerce, test = COMPARISONS[name]
        left, right = self.value(args[0]), self.value(args[1])
        if name == "StringMatches" and isinstance(right, Literal):
            if not isinstance(right.value, str):
                raise self.fail(args[1], "StringMatches needs a string pattern")
            wildcard(right.value)
        return Compare(name, left, right, coerce, test)

    def arity(self, at: Tree[Token] | Token, args: list[Any], count: int) -> None:
        if len(args) != count:
            raise self.fail(
                at, f"{at} takes {count} argument{'s' if count > 1 else ''}, not {len(args)}"
            )

    def value(self, node: Tree[Token] | Token) -> Value:
        if isinstance(node, Tree):
            if node.data == "call":
                name_token, *args = node.children
                if str(name_token) != "Array":
                    raise self.fail(node, f"{name_token}(...) is a condition, not a value")
                self.arity(name_token, args, 2)
                array, sub = self.ref(args[0]), self.ref(args[1])
                if array.relative:
                    raise self.fail(args[0], "Array's first argument must start at $")
                return ArrayValues(array, sub)
            if node.data == "path":
                return self.ref(node)
            if node.data in ("true", "false", "null"):
                return Literal({"true": True, "false": False, "null": None}[str(node.data)])
            token = node.children[0]
            if node.data == "string":
                return Literal(_unquote(str(token)))
            if node.data == "number":
                return Literal(float(str(token)))
        raise self.fail(node, "expected a value")

    def ref(self, node: Tree[Token] | Token) -> Ref:
        token = node.children[0] if isinstance(node, Tree) else node
        if not (isinstance(token, Token) and token.type == "PATH"):
            raise self.fail(node, "expected a reference such as [$.afterData.field]")
        inner = str(token)[1:-1].strip()
        relative = inner.startswith("@")
        expression = "$" + inner[1:]
        try:
            path = parse_jsonpath(expression)
        except (JsonPathLexerError, JsonPathParserError, Exception) as err:
            raise self.fail(token, f"not a JSONPath: {inner!r} ({err})") from None
        return Ref(inner, relative, path)


def _unquote(literal: str) -> str:
    import json  # noqa: PLC0415 - only for string literals

    result = json.loads(literal)
    assert isinstance(result, str)
    return result


def evaluate(expression: str | Expression | None, event: Mapping[str, Any]) -> bool:
    """Evaluate a condition against an event: no expression means "always"."""
    if expression is None or (isinstance(expression, str) and not expression.strip()):
        return True
    compiled = parse(expression) if isinstance(expression, str) else expression
    return compiled(event)


def references(expression: Expression) -> Iterable[str]:
    """The JSONPath texts an expression reads (for documentation and indexing)."""
    stack: list[Any] = [expression.condition]
    while stack:
        node = stack.pop()
        if isinstance(node, Ref):
            yield node.text
        elif isinstance(node, ArrayValues):
            stack += [node.array, node.sub]
        elif isinstance(node, All | Any_):
            stack += list(node.parts)
        elif isinstance(node, Not):
            stack.append(node.part)
        elif isinstance(node, Exists):
            stack.append(node.value)
        elif isinstance(node, Compare):
            stack += [node.left, node.right]


def canonical(text: str) -> str:
    """A normal form of an expression for duplicate detection: no layout, AND/OR arguments
    sorted (their order does not change the meaning), literals re-rendered. Raises
    :class:`ConditionSyntaxError` like :func:`parse`."""
    parse(text)  # the same refusals, with positions
    return _render(_parser().parse(text))


def _render(node: Tree[Token] | Token) -> str:  # noqa: PLR0911
    import json  # noqa: PLC0415

    if isinstance(node, Token):
        return str(node)
    if node.data == "call":
        name_token, *args = node.children
        parts = [_render(a) for a in args]
        if str(name_token) in ("AND", "OR"):
            parts = sorted(set(parts))
            if len(parts) == 1 and str(name_token) == "AND":
                return parts[0]
        return f"{name_token}({','.join(parts)})"
    if node.data == "path":
        inner = str(node.children[0])[1:-1]
        return "[" + "".join(inner.split()) + "]"
    if node.data == "string":
        return json.dumps(_unquote(str(node.children[0])))
    if node.data == "number":
        return repr(float(str(node.children[0])))
    return str(node.data)
