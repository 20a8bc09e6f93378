"""Step parameter resolution, with type coercion, defaults,
``is_required``, ``max_length`` and conditional params, over one execution context:

    {"trigger": {...}, "payload": {...}, "steps": {step_id: output}, "globals": {...},
     "errors": {step_id: {"Error", "Cause"}}, "loops": {...}}

Errors: :class:`ParamError` (a ``ValueError``) naming the param; it fails the step, so the step's
retry and catch path apply.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jsonpath_ng.exceptions import JsonPathLexerError, JsonPathParserError
from jsonpath_ng.parser import parse as parse_jsonpath

from aegis_orchestration.dsl import parse
from aegis_orchestration.model import DataType, Job, SourceType, StepParam

ENV_PREFIX = "AEGIS_JOB_"
# sources whose values come from devices and services, not from the job's author
_DATA_SOURCES = frozenset({SourceType.TRIGGER_DATA, SourceType.PAYLOAD, SourceType.RETURN_DATA})
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_MISSING = object()


class ParamError(ValueError):
    def __init__(self, param: StepParam, message: str) -> None:
        super().__init__(f"param {param.param_key!r} ({param.id}): {message}")
        self.param_id = param.id


def lookup(document: Any, path: str | None) -> Any:
    """The first value of JSONPath ``path`` in ``document``; ``_MISSING`` when there is none."""
    if not path:
        return _MISSING
    try:
        matches = parse_jsonpath(path if path.startswith("$") else f"$.{path}").find(document)
    except (JsonPathLexerError, JsonPathParserError, Exception):
        return _MISSING
    if not matches:
        return _MISSING
    if len(matches) == 1:
        return matches[0].value
    return [m.value for m in matches]


def source_value(  # noqa: PLR0911 - one return per source
    param: StepParam,
    context: Mapping[str, Any],
    environment: Mapping[str, str],
) -> Any:
    match param.source_type:
        case SourceType.TRIGGER_DATA:
            return lookup(context.get("trigger"), param.ref_path)
        case SourceType.PAYLOAD:
            return lookup(context.get("payload"), param.ref_path)
        case SourceType.RETURN_DATA:
            return lookup(context.get("steps"), param.ref_path)
        case SourceType.GLOBAL_TASK_PARAMETER:
            globals_ = context.get("globals") or {}
            return globals_.get(param.ref_path or "", _MISSING)
        case SourceType.STATIC:
            return _MISSING if param.param_value is None else param.param_value
        case SourceType.ENVIRONMENT:
            if param.param_value is None:
                return _MISSING
            return _environment(param, str(param.param_value), environment)


def _environment(param: StepParam, template: str, environment: Mapping[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if not name.startswith(ENV_PREFIX):
            raise ParamError(param, f"only {ENV_PREFIX}* variables may be read, not {name}")
        if name not in environment:
            raise ParamError(param, f"environment variable {name} is not set")
        return environment[name]

    return _PLACEHOLDER.sub(one, template)


def coerce(param: StepParam, value: Any) -> Any:  # noqa: PLR0911, PLR0912 - one branch per type
    kind = param.data_type
    try:
        if kind is DataType.STRING:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            if isinstance(value, int | float) and not isinstance(value, bool):
                text = str(value)
            if param.max_length is not None and len(text) > param.max_length:
                raise ParamError(param, f"longer than max_length {param.max_length}")
            return text
        if kind in (DataType.NUMBER, DataType.INTEGER):
            if isinstance(value, bool):
                raise ParamError(param, "a boolean is not a number")
            number = float(value)
            if not math.isfinite(number):
                raise ParamError(param, "not a finite number")
            if kind is DataType.INTEGER:
                if number != int(number):
                    raise ParamError(param, f"{value!r} is not an integer")
                return int(number)
            return int(number) if number == int(number) and isinstance(value, int) else number
        if kind is DataType.BOOLEAN:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().upper() in ("Y", "YES", "TRUE", "1"):
                return True
            if isinstance(value, str) and value.strip().upper() in ("N", "NO", "FALSE", "0"):
                return False
            if isinstance(value, int | float):
                return bool(value)
            raise ParamError(param, f"{value!r} is not a boolean")
        if kind in (DataType.JSON, DataType.OBJECT, DataType.ARRAY):
            result = json.loads(value) if isinstance(value, str) else value
            if param.max_length is not None and len(json.dumps(result)) > param.max_length:
                raise ParamError(param, f"longer than max_length {param.max_length}")
            return result
    except (TypeError, ValueError) as err:
        if isinstance(err, ParamError):
            raise
        raise ParamError(param, f"{value!r:.80} is not {kind.value}") from None


def resolve_params(
    job: Job,
    step_id: str,
    context: Mapping[str, Any],
    environment: Mapping[str, str] | None = None,
    *,
    escape: Callable[[str], str] | None = None,
) -> dict[str, Any]:
    """The input of one step: its top-level params by ``param_key`` (nested ones inside).

    ``escape``, when given, is applied to every string that comes from data (the trigger, the
    payload, earlier steps' results), not to what the job's author wrote: device data put into a
    Slack message cannot add mentions or links."""
    params = job.params_of(step_id)
    env = environment or {}
    return _resolve_level(params, None, context, env, escape)


def slack_escape(text: str) -> str:
    """Text Slack shows as written: ``&``, ``<`` and ``>`` escaped, so ``<!channel>`` or
    ``<https://evil|click>`` in device data stays text (Slack's own escaping rule)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _escaped(value: Any, escape: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, Mapping):
        return {k: _escaped(v, escape) for k, v in value.items()}
    if isinstance(value, list):
        return [_escaped(v, escape) for v in value]
    return value


def _resolve_level(
    params: list[StepParam],
    parent: str | None,
    context: Mapping[str, Any],
    env: Mapping[str, str],
    escape: Callable[[str], str] | None,
) -> dict[str, Any]:
    level = sorted(
        (p for p in params if p.parent_param_id == parent and p.param_type != "OUT"),
        key=lambda p: (p.param_index or 0, p.param_seq or 0, p.id),
    )
    resolved: dict[str, Any] = {}
    for param in level:
        value = _resolve_one(param, params, context, env, escape)
        if value is not _MISSING:
            resolved[param.param_key] = value
    return resolved


def _resolve_one(
    param: StepParam,
    params: list[StepParam],
    context: Mapping[str, Any],
    env: Mapping[str, str],
    escape: Callable[[str], str] | None,
) -> Any:
    if param.condition_expr and not parse(param.condition_expr)(context):
        return _MISSING
    if param.data_type in (DataType.OBJECT, DataType.ARRAY) and any(
        p.parent_param_id == param.id for p in params
    ):
        nested = _resolve_level(params, param.id, context, env, escape)
        value: Any = nested if param.data_type is DataType.OBJECT else list(nested.values())
    else:
        value = source_value(param, context, env)
        if escape is not None and param.source_type in _DATA_SOURCES and value is not _MISSING:
            value = _escaped(value, escape)
    return _settled(param, value, "its source")


def _settled(param: StepParam, value: Any, where: str) -> Any:
    """``value`` coerced, or the default when there is none; ``_MISSING`` for an optional
    param without either; :class:`ParamError` for a required one."""
    if value is _MISSING or value is None:
        if param.default_value is not None:
            value = param.default_value
        elif param.is_required:
            raise ParamError(param, f"required, and {where} has no value for it")
        else:
            return _MISSING
    return coerce(param, value)


def write_outputs(job: Job, step_id: str, output: Any, context: dict[str, Any]) -> dict[str, Any]:
    """After a TASK step succeeded: each of its OUT and INOUT params takes its value from the
    step's output (an OUT param at ``ref_path``, else at its key; an INOUT param at its key, the
    value it went in with coming back changed) and writes it, coerced to its ``data_type``,
    where ``target_type`` says: the job's globals (the default; later steps read it with
    GLOBAL_TASK_PARAMETER) or the execution's payload (PAYLOAD). Returns what was written, by
    target. A required one the output lacks raises :class:`ParamError`."""
    written: dict[str, Any] = {}
    for param in job.params_of(step_id):
        if param.param_type == "IN" or param.parent_param_id is not None:
            continue
        path = param.ref_path if param.param_type == "OUT" and param.ref_path else None
        found = lookup(output, path) if path else _key_of(output, param.param_key)
        value = _settled(param, found, "the step's output")
        if value is _MISSING:
            continue
        target = "payload" if param.target_type == "PAYLOAD" else "globals"
        context.setdefault(target, {})[param.param_key] = value
        written.setdefault(target, {})[param.param_key] = value
    return written


def _key_of(output: Any, key: str) -> Any:
    return output.get(key, _MISSING) if isinstance(output, Mapping) else _MISSING


REDACTED = "**********"
_SHORTEST_SECRET = 4  # shorter values (a flag, a digit) would blot out ordinary text


def environment_names(params: Iterable[StepParam]) -> set[str]:
    """The variables the ENVIRONMENT params among ``params`` read (``${NAME}`` in their value)."""
    return {
        name
        for param in params
        if param.source_type is SourceType.ENVIRONMENT and param.param_value is not None
        for name in _PLACEHOLDER.findall(str(param.param_value))
    }


def environment_secrets(
    job: Job, step_id: str, environment: Mapping[str, str] | None = None
) -> list[str]:
    """The values of the ``AEGIS_JOB_*`` variables the step's ENVIRONMENT params read: webhook
    URLs with their tokens, keys. They go into the call, never into the execution's log, its
    context or its claim-check objects (:func:`scrub`)."""
    env = environment or {}
    found = {env.get(name, "") for name in environment_names(job.params_of(step_id))}
    secrets = {value for value in found if len(value) >= _SHORTEST_SECRET}
    return sorted(secrets, key=len, reverse=True)  # a longer secret before one inside it


def scrub(value: Any, secrets: list[str]) -> Any:
    """``value`` with every occurrence of each secret replaced by ``**********`` (in strings,
    keys and nested lists and mappings)."""
    if not secrets:
        return value
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, Mapping):
        return {scrub(k, secrets): scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(v, secrets) for v in value]
    return value
