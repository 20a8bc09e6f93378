"""Policy conditions and bucket policies for the local emulator, evaluated as AWS does.

moto's IAM enforcement matches a statement's action and resource, but of its ``Condition`` block
it knows one operator (``StringEquals``) and one context key (``sts:ExternalId``); every other
operator is skipped as if it held, and a condition that fails turns even an ``Allow`` into an
explicit deny. It never reads a bucket policy. So the two guards AEGIS puts below its own code
could not be tested on it: the bucket policy that refuses raw/ overwrites and deletes, and the
``dynamodb:LeadingKeys`` conditions that keep each role to the key families it writes.

This module supplies what that needs, and :func:`aegis_devstack.motoserver.authorize_like_aws`
installs it:

* a request context per call (:func:`request_context`): ``aws:PrincipalArn`` (an assumed role's
  role ARN, as AWS reports it), ``s3:if-none-match`` / ``s3:if-match`` from the headers,
  ``dynamodb:LeadingKeys`` (the partition key values a call touches), ``dynamodb:Attributes``,
  ``dynamodb:Select`` and ``dynamodb:ReturnValues``;
* the condition operators of IAM's policy grammar that policies here use (``String*``,
  ``Arn*``, ``Null``, ``Bool``, with ``ForAllValues:`` / ``ForAnyValue:`` and ``...IfExists``);
  an operator it does not know is an error, never a silent pass;
* statement semantics as AWS has them: a statement whose condition fails does not apply;
* the bucket policy's ``Deny`` statements, applied after the identity policy allowed.

An ``Allow`` in a bucket policy grants nothing here (same-account access is decided by the
identity policies, which is how AEGIS deploys); the template ships denials only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from functools import lru_cache
from types import MappingProxyType
from typing import Any

Context = Mapping[str, list[str]]

# the context of the request being authorized (requests are served one at a time, but a
# ContextVar keeps that an implementation detail of the server, not an assumption of this code)
CURRENT: ContextVar[Context] = ContextVar("aegis_request_context", default=MappingProxyType({}))

_SET_PREFIXES = ("ForAllValues:", "ForAnyValue:")
_ASSUMED_ROLE = re.compile(r"arn:([^:]+):sts::(\d+):assumed-role/([^/]+)/.+")
_EXPRESSION_NAME = re.compile(r"#[A-Za-z0-9_]+")


class UnknownOperator(ValueError):
    """A condition operator this evaluator does not implement: refusing to guess."""


# -- operators ---------------------------------------------------------------------------------


@lru_cache(maxsize=1024)
def _wildcard(pattern: str, ignore_case: bool = False) -> re.Pattern[str]:
    """IAM's ``*`` (any run) and ``?`` (one character); every other character literal."""
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile("".join(parts), re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def _arn_like(pattern: str, value: str) -> bool:
    """ArnLike: six colon-separated parts, each matched with wildcards on its own."""
    want, have = pattern.split(":", 5), value.split(":", 5)
    if len(want) != 6 or len(have) != 6:
        return False
    return all(_wildcard(w).fullmatch(h) for w, h in zip(want, have, strict=True))


def _match_one(operator: str, wanted: list[str], value: str) -> bool:
    """Does ``value`` satisfy the positive form of ``operator`` for any of ``wanted``?"""
    if operator == "StringEquals":
        return value in wanted
    if operator == "StringEqualsIgnoreCase":
        return value.lower() in {w.lower() for w in wanted}
    if operator == "StringLike":
        return any(_wildcard(w).fullmatch(value) for w in wanted)
    if operator in ("ArnEquals", "ArnLike"):
        return any(_arn_like(w, value) for w in wanted)
    if operator == "Bool":
        return value.lower() in {w.lower() for w in wanted}
    raise UnknownOperator(operator)


_NEGATED = {
    "StringNotEquals": "StringEquals",
    "StringNotEqualsIgnoreCase": "StringEqualsIgnoreCase",
    "StringNotLike": "StringLike",
    "ArnNotEquals": "ArnEquals",
    "ArnNotLike": "ArnLike",
}


def _values(value: Any) -> list[str]:
    items = value if isinstance(value, list) else [value]
    return [str(v).lower() if isinstance(v, bool) else str(v) for v in items]


def condition_holds(operator: str, key: str, wanted: Any, context: Context) -> bool:
    """One ``operator: {key: wanted}`` entry of a Condition block, as IAM evaluates it.

    A key missing from the request: ``Null`` asks exactly that; ``...IfExists`` and
    ``ForAllValues:`` hold; every other operator fails (negated ones too, as on AWS)."""
    wanted_values = _values(wanted)
    present = context.get(key)
    if operator == "Null":
        return (present is None or present == []) == (wanted_values[0] == "true")
    qualifier = ""
    for prefix in _SET_PREFIXES:
        if operator.startswith(prefix):
            qualifier, operator = prefix, operator.removeprefix(prefix)
    if_exists = operator.endswith("IfExists")
    operator = operator.removesuffix("IfExists")
    if not present:
        return if_exists or qualifier == "ForAllValues:"
    negated = operator in _NEGATED
    positive = _NEGATED.get(operator, operator)

    def matches(value: str) -> bool:
        found = _match_one(positive, wanted_values, value)
        return not found if negated else found

    if qualifier == "ForAllValues:":
        return all(matches(v) for v in present)
    if qualifier == "ForAnyValue:":
        return any(matches(v) for v in present)
    if len(present) != 1:  # a multivalued key needs a set qualifier
        return False
    return matches(present[0])


def conditions_hold(block: Mapping[str, Mapping[str, Any]] | None, context: Context) -> bool:
    """Every entry of a statement's Condition block holds (entries are ANDed, values ORed)."""
    return all(
        condition_holds(operator, key, wanted, context)
        for operator, entries in (block or {}).items()
        for key, wanted in entries.items()
    )


# -- statements --------------------------------------------------------------------------------


def _listed(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def _any_match(patterns: Iterable[str], value: str, ignore_case: bool = False) -> bool:
    return any(_wildcard(p, ignore_case).fullmatch(value) for p in patterns)


def statement_applies(statement: Mapping[str, Any], action: str, resource: str) -> bool:
    """Action, resource and condition of one statement match the current request."""
    if "NotAction" in statement:
        if _any_match(_listed(statement["NotAction"]), action, ignore_case=True):
            return False
    elif not _any_match(_listed(statement.get("Action")), action, ignore_case=True):
        return False
    if "NotResource" in statement:
        if _any_match(_listed(statement["NotResource"]), resource):
            return False
    elif "Resource" in statement and not _any_match(_listed(statement["Resource"]), resource):
        return False
    return conditions_hold(statement.get("Condition"), CURRENT.get())


def principal_matches(principal: Any, arn: str) -> bool:
    """A resource policy's Principal: ``*``, ``{"AWS": "*"}`` or the caller's ARN(s)."""
    if principal == "*":
        return True
    if isinstance(principal, Mapping):
        named = _listed(principal.get("AWS"))
        return "*" in named or arn in named
    return False


def bucket_policy_denies(policy: str | bytes | None, action: str, resource: str) -> str | None:
    """The Sid (or index) of the bucket policy's Deny that applies to this request, if any."""
    if not policy:
        return None
    document = json.loads(policy)
    statements = document.get("Statement", [])
    principal = (CURRENT.get().get("aws:PrincipalArn") or [""])[0]
    for index, statement in enumerate(_listed_statements(statements)):
        if statement.get("Effect") != "Deny":
            continue
        if not principal_matches(statement.get("Principal"), principal):
            continue
        if statement_applies(statement, action, resource):
            return str(statement.get("Sid", index))
    return None


def _listed_statements(statements: Any) -> list[Mapping[str, Any]]:
    return [statements] if isinstance(statements, Mapping) else list(statements)


# -- the request context -----------------------------------------------------------------------


def principal_arn(caller_arn: str) -> str:
    """``aws:PrincipalArn``: an assumed-role session is reported as its role."""
    m = _ASSUMED_ROLE.fullmatch(caller_arn)
    return f"arn:{m[1]}:iam::{m[2]}:role/{m[3]}" if m else caller_arn


def _header(headers: Any, name: str) -> str | None:
    try:
        value = headers.get(name)
    except AttributeError:
        return None
    if value is None and isinstance(headers, Mapping):
        lowered = {str(k).lower(): v for k, v in headers.items()}
        value = lowered.get(name.lower())
    return None if value is None else str(value)


def s3_context(headers: Any) -> dict[str, list[str]]:
    context: dict[str, list[str]] = {}
    for header, key in (("If-None-Match", "s3:if-none-match"), ("If-Match", "s3:if-match")):
        value = _header(headers, header)
        if value is not None:
            context[key] = [value]
    return context


def dynamodb_context(
    request: Mapping[str, Any], hash_key: str | None, table: str | None = None
) -> dict[str, list[str]]:
    """The DynamoDB condition keys of one request (or of one table's part of a batch)."""
    items = _request_items(request, table)
    attributes = _request_attributes(request)
    leading: list[str] = []
    for item in items:
        attributes.update(item)
        value = item.get(hash_key or "", {})
        if isinstance(value, Mapping) and value:
            leading.append(str(next(iter(value.values()))))
    if hash_key and not leading:  # a Query names its partition key value in the condition
        leading.extend(_queried_partition(request, hash_key))
    context: dict[str, list[str]] = {}
    if leading:
        context["dynamodb:LeadingKeys"] = sorted(set(leading))
    if attributes:
        context["dynamodb:Attributes"] = sorted(attributes)
    for field, key in (("Select", "dynamodb:Select"), ("ReturnValues", "dynamodb:ReturnValues")):
        if request.get(field):
            context[key] = [str(request[field])]
    return context


def _request_items(request: Mapping[str, Any], table: str | None) -> list[Mapping[str, Any]]:
    """The keys and items a request names: its own, or a batch's for ``table``."""
    items = [request[field] for field in ("Key", "Item") if field in request]
    if table is None:
        return items
    spec = request.get("RequestItems", {}).get(table)
    if isinstance(spec, Mapping):  # BatchGetItem: {"Keys": [...]}
        return [*items, *spec.get("Keys", [])]
    for entry in spec or []:  # BatchWriteItem: puts and deletes
        for kind, field in (("PutRequest", "Item"), ("DeleteRequest", "Key")):
            if kind in entry:
                items.append(entry[kind][field])
    return items


def _request_attributes(request: Mapping[str, Any]) -> set[str]:
    """Attribute names a request reads or writes by name (``dynamodb:Attributes``)."""
    attributes: set[str] = set(request.get("ExpressionAttributeNames", {}).values())
    attributes.update(request.get("AttributesToGet", []))
    for spelled in (request.get("ProjectionExpression") or "").split(","):
        name = spelled.strip()
        if name and not _EXPRESSION_NAME.fullmatch(name):
            attributes.add(name.split(".", 1)[0].split("[", 1)[0])
    return attributes


def _queried_partition(request: Mapping[str, Any], hash_key: str) -> list[str]:
    expression = request.get("KeyConditionExpression") or ""
    names = {v: k for k, v in request.get("ExpressionAttributeNames", {}).items()}
    spelled = [hash_key, names.get(hash_key, hash_key)]
    for spelling in spelled:
        m = re.search(rf"(?<![\w#]){re.escape(spelling)}\s*=\s*(:[A-Za-z0-9_]+)", expression)
        if m:
            value = request.get("ExpressionAttributeValues", {}).get(m[1], {})
            if isinstance(value, Mapping) and value:
                return [str(next(iter(value.values())))]
    return []
