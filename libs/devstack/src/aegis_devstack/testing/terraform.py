"""The Terraform module of ``deploy/terraform`` read with python-hcl2, and the few expressions it
uses evaluated for given inputs, so a test can compare what it declares with the CloudFormation
template.

This is not Terraform: it evaluates references (``var.x``, ``local.x``, ``each.key``,
``data.a.b.c``, ``aws_iam_role.task[each.key].arn``, ``x.list[0]``), string templates, object
and tuple literals, ``for`` expressions (``[for x in c : v if cond]``, ``{for k, v in c : k => v}``),
``==``/``!=``, ``c ? a : b`` and the functions of :data:`FUNCTIONS`, and raises
:class:`Unsupported` on anything else, so a change to the module that this reader does not
understand fails loudly instead of comparing something else. Sets are sorted lists (Terraform
iterates a set of strings in that order). ``terraform validate`` and the apply on the emulator
(tests/integration/test_terraform.py) evaluate the whole module for real.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import hcl2
import yaml
from hcl2.utils import SerializationOptions

OPTIONS = SerializationOptions(with_comments=False, explicit_blocks=False)
REFERENCE = re.compile(r'[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*|\[(?:"[^"]*"|[\w.]+)\])*')
# `[for x in ...` / `{for k, v in ...`: the opening, the one or two names, the rest
FOR = re.compile(r"([\[{])\s*for\s+([A-Za-z_]\w*)(?:\s*,\s*([A-Za-z_]\w*))?\s+in\s+(.*)", re.DOTALL)
ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}


class Unsupported(ValueError):
    """An expression this reader does not evaluate."""


def unquote(name: str) -> str:
    return name[1:-1] if len(name) >= 2 and name[0] == name[-1] == '"' else name


def load_module(directory: Path, *, text: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every ``.tf`` file of ``directory`` (or ``text``: file name to its content) merged:
    ``{"resource": {type: {name: body}}, "data": ..., "variable": {name: body},
    "locals": {name: expression}, "output": {name: body}}``."""
    files = (
        dict(text) if text is not None else {p.name: p.read_text() for p in directory.glob("*.tf")}
    )
    merged: dict[str, Any] = {
        "resource": {},
        "data": {},
        "variable": {},
        "locals": {},
        "output": {},
    }
    for name in sorted(files):
        parsed = hcl2.loads(files[name], serialization_options=OPTIONS)
        for kind in ("resource", "data"):
            for block in parsed.get(kind, []):
                for rtype, named in block.items():
                    for rname, body in named.items():
                        merged[kind].setdefault(unquote(rtype), {})[unquote(rname)] = body
        for kind in ("variable", "output"):
            for block in parsed.get(kind, []):
                for vname, body in block.items():
                    merged[kind][unquote(vname)] = body
        for block in parsed.get("locals", []):
            merged["locals"].update(block)
    return merged


def _outside_strings(text: str, start: int = 0) -> Iterator[tuple[int, str]]:
    """Each index and character of ``text`` from ``start`` that is not inside a quoted string."""
    i, quoted = start, False
    while i < len(text):
        ch = text[i]
        if quoted:
            if ch == "\\":
                i += 1
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        else:
            yield i, ch
        i += 1


def _split_top(text: str, separator: str) -> list[str]:
    """``text`` split at ``separator`` outside strings, parentheses, brackets and braces."""
    parts, depth, start = [], 0, 0
    for i, ch in _outside_strings(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and i >= start and text.startswith(separator, i):
            parts.append(text[start:i].strip())
            start = i + len(separator)
    parts.append(text[start:].strip())
    return parts


def _call(expr: str) -> tuple[str, list[str]] | None:
    """``name(arg, ...)`` as its name and argument texts, when ``expr`` is exactly one call."""
    match = re.match(r"([a-z_]+)\(", expr)
    if not match or _closing(expr, match.end() - 1, "(", ")") != len(expr) - 1:
        return None
    inner = expr[match.end() : -1]
    return match[1], _split_top(inner, ",") if inner.strip() else []


class Scope:
    """Values of references (``{"var": {...}, "local": {...}, "each": {...}, ...}``)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.values = dict(values)

    def with_each(self, key: str, value: Any) -> Scope:
        return Scope({**self.values, "each": {"key": key, "value": value}})

    def value(self, raw: Any) -> Any:
        """A value as python-hcl2 gives it (a literal, a quoted template, ``${expression}``,
        a block's dict or list), evaluated."""
        if isinstance(raw, dict):
            return {unquote(k): self.value(v) for k, v in raw.items()}
        if isinstance(raw, list):
            return [self.value(v) for v in raw]
        if not isinstance(raw, str):
            return raw
        if raw.startswith('"') and raw.endswith('"'):
            return self.template(raw[1:-1])
        if raw.startswith("${") and raw.endswith("}"):
            return self.expression(raw[2:-1].strip())
        return raw  # a bare keyword such as a variable's type

    def template(self, text: str) -> str:
        out, i = [], 0
        while i < len(text):
            if text[i] == "\\" and i + 1 < len(text):
                if text[i + 1] not in ESCAPES:
                    raise Unsupported(f"the escape \\{text[i + 1]} in {text!r}")
                out.append(ESCAPES[text[i + 1]])
                i += 2
            elif text.startswith("$${", i):
                out.append("${")
                i += 3
            elif text.startswith("${", i):
                end = _closing(text, i + 1)
                out.append(str(self.expression(text[i + 2 : end].strip())))
                i = end + 1
            else:
                out.append(text[i])
                i += 1
        return "".join(out)

    def expression(self, expr: str) -> Any:  # noqa: PLR0911 (one return per form it reads)
        expr = expr.strip()
        if expr in ("true", "false"):
            return expr == "true"
        if re.fullmatch(r"-?\d+", expr):
            return int(expr)
        if expr.startswith('"') and _closing_quote(expr) == len(expr) - 1:
            return self.template(expr[1:-1])
        if len(branches := _split_top(expr, " ? ")) == 2:
            then, otherwise = _split_top(branches[1], " : ")
            return self.expression(then if self.expression(branches[0]) else otherwise)
        for op in (" != ", " == "):
            if len(sides := _split_top(expr, op)) == 2:
                equal = self.expression(sides[0]) == self.expression(sides[1])
                return equal if op == " == " else not equal
        if re.match(r"[{\[]\s*for\s", expr):
            return self.for_expression(expr)
        if expr.startswith(("{", "[")):
            parsed = hcl2.loads(f"v = {expr}", serialization_options=OPTIONS)["v"]
            return self.value(parsed)
        if (call := _call(expr)) is not None:
            return self.function(*call)
        if REFERENCE.fullmatch(expr):
            return self.reference(expr)
        raise Unsupported(expr)

    def for_expression(self, expr: str) -> Any:
        """``[for x in c : v if cond]`` (a list) or ``{for k, v in c : key => v if cond}`` (an
        object); over a list one name is the element, two the index and the element; over an
        object one name is the value, two the key and the value (by key). No grouping (``...``)."""
        opening, closing = (expr[0], "]" if expr[0] == "[" else "}")
        match = FOR.fullmatch(expr[:-1])
        if not match or _closing(expr, 0, opening, closing) != len(expr) - 1:
            raise Unsupported(f"a for expression: {expr}")
        _, first, second, rest = match.groups()
        collection, *body = _split_top(rest, " : ")
        result, *condition = _split_top(" : ".join(body), " if ")
        if not body or len(condition) > 1 or result.endswith("..."):
            raise Unsupported(f"a for expression: {expr}")
        key = None
        if opening == "{":
            if len(parts := _split_top(result, " => ")) != 2:
                raise Unsupported(f"a for expression: {expr}")
            key, result = parts
        found = self.expression(collection)
        # an object's (a map's) elements in the lexical order of their keys, as Terraform's
        pairs = sorted(found.items()) if isinstance(found, Mapping) else enumerate(found)
        out: dict[str, Any] = {}
        listed: list[Any] = []
        for index, element in pairs:
            names = {first: element} if second is None else {first: index, second: element}
            inner = Scope({**self.values, **names})
            if condition and not inner.expression(condition[0]):
                continue
            if key is None:
                listed.append(inner.expression(result))
                continue
            name = inner.expression(key)
            if name in out:
                raise ValueError(f"{expr}: the key {name!r} twice")
            out[name] = inner.expression(result)
        return listed if key is None else out

    def function(self, name: str, args: list[str]) -> Any:
        if name not in FUNCTIONS:
            raise Unsupported(f"{name}({', '.join(args)})")
        arity, call = FUNCTIONS[name]
        if arity is not None and len(args) != arity:
            raise Unsupported(f"{name} takes {arity} arguments: {name}({', '.join(args)})")
        return call(*(self.expression(a) for a in args))

    def reference(self, ref: str) -> Any:
        value: Any = self.values
        for part in re.findall(r'\.?([A-Za-z_][\w-]*)|\[("[^"]*"|[\w.]+)\]', ref):
            name, index = part
            key = name or (unquote(index) if index.startswith('"') else self.expression(index))
            if isinstance(value, list) and isinstance(key, int) and 0 <= key < len(value):
                value = value[key]
                continue
            if not isinstance(value, Mapping) or key not in value:
                raise Unsupported(f"{ref}: nothing known as {key!r}")
            value = value[key]
        return value


def _replace(text: str, substring: str, replacement: str) -> str:
    if len(substring) > 1 and substring.startswith("/") and substring.endswith("/"):
        raise Unsupported(f"replace with a regular expression: {substring}")
    return text.replace(substring, replacement)


def _fileset(directory: str, pattern: str) -> list[str]:
    """Terraform's fileset: the files under ``directory`` matching ``pattern``, relative, sorted."""
    root = Path(directory)
    return sorted(str(p.relative_to(root)) for p in root.glob(pattern) if p.is_file())


def _slice(values: list[Any], start: int, end: int) -> list[Any]:
    if not 0 <= start <= end <= len(values):
        raise ValueError(f"slice: [{start}:{end}] of {len(values)} elements")
    return values[start:end]


def _one(values: list[Any]) -> Any:
    if len(values) > 1:
        raise ValueError(f"one: {len(values)} elements, not one or none")
    return values[0] if values else None


def _coalesce(*values: Any) -> Any:
    return next((v for v in values if v not in ("", None)), None)


def _yamldecode(text: str) -> Any:
    """Terraform's yamldecode: one YAML document (PyYAML refuses a second too)."""
    return yaml.safe_load(text)


# the functions the reader evaluates: name -> (number of arguments, or None for any; the call)
FUNCTIONS: dict[str, tuple[int | None, Any]] = {
    "jsonencode": (1, json.dumps),
    "jsondecode": (1, json.loads),
    "yamldecode": (1, _yamldecode),
    "coalesce": (None, _coalesce),
    "file": (1, lambda path: Path(path).read_text()),
    "fileset": (2, _fileset),
    "toset": (1, lambda values: sorted(set(values))),
    "tolist": (1, list),
    "setunion": (None, lambda *sets: sorted(set().union(*sets))),
    "concat": (None, lambda *lists: [v for values in lists for v in values]),
    "merge": (None, lambda *maps: {k: v for m in maps for k, v in m.items()}),
    "one": (1, _one),
    "length": (1, len),
    "split": (2, lambda separator, text: text.split(separator)),
    "join": (2, lambda separator, values: separator.join(values)),
    "slice": (3, _slice),
    "replace": (3, _replace),
    "trimprefix": (2, lambda text, prefix: text.removeprefix(prefix)),
    "trimsuffix": (2, lambda text, suffix: text.removesuffix(suffix)),
    "basename": (1, lambda path: path.rsplit("/", 1)[-1]),
}


def _closing(text: str, open_at: int, opening: str = "{", closing: str = "}") -> int:
    """The index of the bracket that closes the one at ``open_at``."""
    depth = 0
    for i, ch in _outside_strings(text, open_at):
        if ch == opening:
            depth += 1
        elif ch == closing:
            depth -= 1
            if depth == 0:
                return i
    raise Unsupported(f"no closing {closing!r} in {text!r}")


def _closing_quote(text: str) -> int:
    """The index of the quote that closes the string starting ``text`` (interpolations skipped)."""
    i = 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text.startswith("${", i):
            i = _closing(text, i + 1) + 1
            continue
        if text[i] == '"':
            return i
        i += 1
    raise Unsupported(f"no closing quote in {text!r}")
