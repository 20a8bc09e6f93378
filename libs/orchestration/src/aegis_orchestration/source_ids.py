"""Valid ids for the ids of real tables: UUIDs (upper or lower case), hexadecimal and numeric
keys become job, step, param and condition ids the model accepts, the same every time.

- An id that is valid already is kept as it is.
- Otherwise it is lower-cased, each run of characters an id cannot hold becomes one ``-`` (job
  ids) or ``_`` (the others), and one that does not start with a letter gets the prefix of its
  kind (``job-``, ``step_``, ``param_``, ``condition_``): ``1024`` is the step ``step_1024``,
  ``3F2504E0-4F89-11D3-9A0C-0305E82C3301`` the job ``job-3f2504e0-4f89-11d3-9a0c-0305e82c3301``.
- One that is too long after that (more than 48 characters for a job, 64 for the others), or that
  held characters outside ASCII, keeps a readable prefix and ends in ``-`` / ``_`` and the first
  8 hexadecimal digits of the SHA-256 of the original.

Two originals can become one id (``ABC`` and ``abc``): the tables' import refuses them, naming
both rows, never merging them. :func:`rename_references` carries the step ids a job's
expressions name (``$.steps.{id}``, a RETURN_DATA ``ref_path``) over to the new ids.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from enum import StrEnum

from aegis_orchestration.model import ID_PATTERN, STEP_ID_PATTERN

_JOB = re.compile(ID_PATTERN)
_MEMBER = re.compile(STEP_ID_PATTERN)
JOB_ID_MAX = 48
MEMBER_ID_MAX = 64
DIGEST_LENGTH = 8


class Kind(StrEnum):
    """What an id names, and the prefix an id of it gets when it starts with no letter."""

    JOB = "job"
    STEP = "step"
    PARAM = "param"
    CONDITION = "condition"


def valid_id(original: str, kind: Kind) -> str:
    """The id ``original`` is imported as (see the module's doc); the same for the same input."""
    if kind is Kind.JOB:
        pattern, allowed, separator, longest = _JOB, r"a-z0-9_-", "-", JOB_ID_MAX
    else:
        pattern, allowed, separator, longest = _MEMBER, r"a-z0-9_", "_", MEMBER_ID_MAX
    if pattern.fullmatch(original):
        return original
    text = re.sub(f"[^{allowed}]+", separator, original.lower()).strip("-_")
    if not text[:1].isalpha():
        text = f"{kind.value}{separator}{text}" if text else kind.value
    if len(text) <= longest and original.isascii():
        return text
    digest = hashlib.sha256(original.encode()).hexdigest()[:DIGEST_LENGTH]
    head = text[: longest - DIGEST_LENGTH - 1].rstrip("-_")
    return f"{head}{separator}{digest}"


# the context an execution keeps per step: its output, its error, a CHOICE's loop count
_CONTEXT_ROOTS = ("steps", "errors", "loops")
# one step id in a JSONPath: .name (letters, digits, - and _), ['name'], ["name"] or ."name"
_MEMBER_REF = (
    r"(?:\.(?P<bare>[A-Za-z0-9_-]+)"
    r"""|\[\s*'(?P<single>[^']*)'\s*\]"""
    r"""|\[\s*"(?P<double>[^"]*)"\s*\]"""
    r"""|\."(?P<quoted>[^"]*)")"""
)
_IN_CONTEXT = re.compile(rf"\$\.(?P<root>{'|'.join(_CONTEXT_ROOTS)}){_MEMBER_REF}")
_LEADING = re.compile(rf"^(?P<root>\$)?{_MEMBER_REF}")


def rename_references(text: str, renamed: Mapping[str, str]) -> str:
    """``text`` (a DSL condition on an execution's context) with each ``$.steps.{id}``,
    ``$.errors.{id}`` and ``$.loops.{id}`` naming an original step id of ``renamed`` written
    with the new one (``$.steps.new``)."""
    if not renamed:
        return text

    def swap(match: re.Match[str]) -> str:
        name = _named(match)
        if name not in renamed:
            return match[0]
        return f"$.{match['root']}.{renamed[name]}"

    return _IN_CONTEXT.sub(swap, text)


def rename_step_path(path: str, renamed: Mapping[str, str]) -> str:
    """A RETURN_DATA ``ref_path`` (a JSONPath into the steps' outputs, ``check.items[0]`` or
    ``$.check.items[0]``) whose first member, an original step id of ``renamed``, is written
    with the new one."""
    if not renamed:
        return path
    match = _LEADING.match(path if path.startswith("$") else f".{path}")
    if match is None or _named(match) not in renamed:
        return path
    rest = path[match.end() - (0 if path.startswith("$") else 1) :]
    new = renamed[_named(match)]
    return f"$.{new}{rest}" if path.startswith("$") else f"{new}{rest}"


def _named(match: re.Match[str]) -> str:
    for group in ("bare", "single", "double", "quoted"):
        if match[group] is not None:
            return str(match[group])
    return ""
