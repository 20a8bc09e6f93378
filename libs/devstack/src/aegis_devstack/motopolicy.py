"""IAM policies for the local emulator, evaluated as AWS documents it, and refused where it cannot.

moto's IAM enforcement matches a statement's action and resource, but of its ``Condition`` block
it knows one operator (``StringEquals``) and one context key (``sts:ExternalId``); every other
operator is skipped as if it held, and a condition that fails turns even an ``Allow`` into an
explicit deny. It never reads a bucket policy. So the guards AEGIS puts below its own code could
not be tested on it: the bucket policy that refuses raw/ overwrites and deletes, and the
``dynamodb:LeadingKeys`` / ``dynamodb:Attributes`` conditions that keep each role to its own keys.

This module supplies what that needs, and :func:`aegis_devstack.motoserver.authorize_like_aws`
installs it:

* :func:`validate_policy`: every policy the emulator is given (identity, trust and bucket
  policies) is checked when it is stored, and one using anything this module does not evaluate
  as AWS does is refused with :class:`UnsupportedPolicy` naming each problem: an unknown element
  or operator, a Numeric/Date/IpAddress/Binary operator, a policy variable (``${...}``), a
  condition key the emulator never puts in a request's context, a multivalued key without
  ``ForAllValues:``/``ForAnyValue:``, a principal form it cannot match, an ``Allow`` in a bucket
  policy. A policy it cannot follow fails loudly instead of being half-applied;
* :func:`decide`: AWS's evaluation logic ("Policy evaluation logic" in the IAM User Guide): an
  explicit ``Deny`` in any policy wins, then an ``Allow`` in an identity policy, else the request
  is implicitly denied; the bucket policy's denials bind every principal;
* conditions as the IAM User Guide's "Condition operators" and "Conditions with multiple context
  keys or values" pages have them (see :func:`condition_holds`);
* a request context per call: ``aws:PrincipalArn`` (an assumed role's role ARN, as AWS reports
  it), ``s3:if-none-match`` / ``s3:if-match`` from the headers, and DynamoDB's
  ``dynamodb:LeadingKeys``, ``dynamodb:Attributes``, ``dynamodb:Select`` and
  ``dynamodb:ReturnValues`` (:func:`dynamodb_context`).

An ``Allow`` in a bucket policy is refused at load: same-account access is decided by the
identity policies here, which is how AEGIS deploys, and the template ships denials only.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Literal

Context = Mapping[str, list[str]]
PolicyKind = Literal["identity", "trust", "bucket"]

# the context of the request being authorized (requests are served one at a time, but a
# ContextVar keeps that an implementation detail of the server, not an assumption of this code)
CURRENT: ContextVar[Context] = ContextVar("aegis_request_context", default=MappingProxyType({}))

_ASSUMED_ROLE = re.compile(r"arn:([^:]+):sts::(\d+):assumed-role/([^/]+)/(.+)")
_IAM_ENTITY = re.compile(r"arn:([^:]+):iam::(\d{12}):(user|role)/(.+)")
_ACCOUNT_ROOT = re.compile(r"arn:[^:]+:iam::(\d{12}):root")
_ACCOUNT_ID = re.compile(r"\d{12}")


class UnsupportedPolicy(ValueError):
    """A policy that uses what this evaluator does not implement as AWS does: refused, never
    half-applied. ``problems`` names each one."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class UnknownOperator(UnsupportedPolicy):
    """A condition operator this evaluator does not implement: refusing to guess."""

    def __init__(self, operator: str) -> None:
        super().__init__([f"condition operator {operator!r} is not implemented"])
        self.operator = operator


class Decision(enum.Enum):
    ALLOW = "allow"
    IMPLICIT_DENY = "implicit deny"
    EXPLICIT_DENY = "explicit deny"


# -- context keys ------------------------------------------------------------------------------

# The keys this emulator puts in a request's context; a policy naming any other key is refused,
# since AWS may well give that key a value where the emulator has none. Key names are
# case-insensitive ("Condition element" in the IAM User Guide), so these are kept lower-case.
SINGLE_VALUED_KEYS = frozenset({
    "aws:principalarn", "aws:securetransport", "s3:if-none-match", "s3:if-match",
    "dynamodb:select", "dynamodb:returnvalues",
})  # fmt: skip
# "Single-valued vs. multivalued context keys": these can hold several values in one request
# and "require a condition set operator"; AWS does not document a plain operator's result on
# them, so a policy that uses one that way is refused
MULTIVALUED_KEYS = frozenset({"dynamodb:leadingkeys", "dynamodb:attributes"})
# known only when a role is assumed: meaningful in a trust policy alone (a session's later
# requests carry no MFA flag here, where AWS would give them one)
TRUST_KEYS = frozenset({"aws:multifactorauthpresent", "sts:externalid"})


# -- operators ---------------------------------------------------------------------------------

_SET_QUALIFIERS = ("ForAllValues:", "ForAnyValue:")
_NEGATED = {
    "StringNotEquals": "StringEquals",
    "StringNotEqualsIgnoreCase": "StringEqualsIgnoreCase",
    "StringNotLike": "StringLike",
    "ArnNotEquals": "ArnEquals",
    "ArnNotLike": "ArnLike",
}
_POSITIVE = frozenset(
    {"StringEquals", "StringEqualsIgnoreCase", "StringLike", "ArnEquals", "ArnLike"}
)
_BASES = _POSITIVE | set(_NEGATED) | {"Bool"}
# operator families AWS has and this evaluator does not: refused at load, never skipped
_NOT_IMPLEMENTED = ("Numeric", "Date", "IpAddress", "NotIpAddress", "BinaryEquals")


@dataclass(frozen=True)
class Operator:
    """A parsed condition operator: ``[ForAllValues:|ForAnyValue:]Base[IfExists]``."""

    base: str
    qualifier: str = ""
    if_exists: bool = False

    @property
    def negated(self) -> bool:
        return self.base in _NEGATED

    @property
    def positive(self) -> str:
        return _NEGATED.get(self.base, self.base)


@lru_cache(maxsize=256)
def parse_operator(name: str) -> Operator:
    """``name`` as an :class:`Operator`; :class:`UnknownOperator` for anything else (``Null`` is
    handled on its own: it takes neither a qualifier nor ``IfExists``)."""
    qualifier = next((q for q in _SET_QUALIFIERS if name.startswith(q)), "")
    rest = name.removeprefix(qualifier)
    base = rest.removesuffix("IfExists")
    if base not in _BASES:
        raise UnknownOperator(name)
    return Operator(base, qualifier, if_exists=base != rest)


@lru_cache(maxsize=1024)
def _wildcard(pattern: str, ignore_case: bool = False) -> re.Pattern[str]:
    """IAM's ``*`` (any run) and ``?`` (one character); every other character literal."""
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile("".join(parts), re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def _arn_like(pattern: str, value: str) -> bool:
    """ArnEquals/ArnLike: six colon-separated parts, each matched with wildcards on its own."""
    want, have = pattern.split(":", 5), value.split(":", 5)
    if len(want) != 6 or len(have) != 6:
        return False
    return all(_wildcard(w).fullmatch(h) for w, h in zip(want, have, strict=True))


def _match_one(operator: str, wanted: str, value: str) -> bool:
    """Does ``value`` satisfy the positive ``operator`` for the one policy value ``wanted``?"""
    if operator == "StringEquals":
        return value == wanted
    if operator == "StringEqualsIgnoreCase":
        return value.lower() == wanted.lower()
    if operator == "StringLike":
        return _wildcard(wanted).fullmatch(value) is not None
    if operator in ("ArnEquals", "ArnLike"):
        return _arn_like(wanted, value)
    if operator == "Bool":
        return value.lower() == wanted.lower()
    raise UnknownOperator(operator)


def _missing_key_holds(op: Operator) -> bool:
    """A key absent from the request (or an empty set of values). "Condition operators": the
    condition is false, but true for a negated operator ("If the policy condition requires that
    the key is not matched ... and the right key is not present, the condition is true") and
    for ``...IfExists``; "Conditions with multiple context keys or values": ``ForAllValues``
    is true on a missing or empty set and ``ForAnyValue`` false, negated or not."""
    if op.qualifier == "ForAllValues:":
        return True
    if op.qualifier == "ForAnyValue:":
        return False
    return op.if_exists or op.negated


def _value_matches(op: Operator, wanted: list[str], value: str) -> bool:
    """One request value against the policy's values: ORed for an operator, NORed for a negated
    one ("Conditions with multiple context keys or values")."""
    found = any(_match_one(op.positive, w, value) for w in wanted)
    return not found if op.negated else found


def _lookup(context: Context, key: str) -> list[str] | None:
    """The request's values of ``key``; condition key names are case-insensitive."""
    wanted = key.lower()
    for name, values in context.items():
        if name.lower() == wanted:
            return values
    return None


def _values(value: Any) -> list[str]:
    items = value if isinstance(value, list) else [value]
    return [str(v).lower() if isinstance(v, bool) else str(v) for v in items]


def condition_holds(operator: str, key: str, wanted: Any, context: Context) -> bool:
    """One ``operator: {key: wanted}`` entry of a Condition block, as IAM evaluates it.

    ``Null`` asks whether the key is absent (or empty); :func:`_missing_key_holds` says what
    every other operator answers then; a single-valued key's one value is matched by
    :func:`_value_matches`; a set qualifier asks it of all (``ForAllValues:``) or any
    (``ForAnyValue:``) of the request's values."""
    wanted_values = _values(wanted)
    present = _lookup(context, key)
    if operator == "Null":
        return (not present) == (wanted_values[0].lower() == "true")
    op = parse_operator(operator)
    if not present:
        return _missing_key_holds(op)
    if op.qualifier == "ForAllValues:":
        return all(_value_matches(op, wanted_values, v) for v in present)
    if op.qualifier == "ForAnyValue:":
        return any(_value_matches(op, wanted_values, v) for v in present)
    if len(present) != 1:
        # validate_policy refuses a plain operator on a multivalued key; never guess here
        raise UnsupportedPolicy([f"{operator} on {key}, which has several values here"])
    return _value_matches(op, wanted_values, present[0])


def conditions_hold(block: Mapping[str, Mapping[str, Any]] | None, context: Context) -> bool:
    """Every entry of a statement's Condition block holds (operators and keys ANDed)."""
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
    """Action (or NotAction: every action but those), resource (or NotResource) and condition of
    one statement match the current request ("Policy evaluation logic"; actions match without
    regard to case, resources with it)."""
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


def _account_of(arn: str) -> str:
    parts = arn.split(":")
    return parts[4] if len(parts) > 5 else ""


def _identity_chain(caller: str) -> list[set[str]]:
    """The identities AWS may check, in turn, for a caller ("NotPrincipal": the account, then
    the user; or the account, the role and the assumed-role session), each as the spellings a
    policy may name it by."""
    if not caller:
        return []
    account = _account_of(caller)
    chain = [{account, f"arn:{caller.split(':')[1]}:iam::{account}:root"}]
    if caller.endswith(":root"):
        return chain
    session = _ASSUMED_ROLE.fullmatch(caller)
    if session:
        chain.append({principal_arn(caller)})
    chain.append({caller})
    return chain


def principal_matches(principal: Any, caller: str) -> bool:
    """A Principal element names the caller: ``*``, ``{"AWS": "*"}``, the caller's ARN, its role
    (an assumed-role session), or its account (the account's ID or root ARN). Service and other
    principal kinds never name an IAM caller."""
    if principal == "*":
        return True
    if not isinstance(principal, Mapping):
        return False
    named = set(_listed(principal.get("AWS")))
    if "*" in named:
        return True
    return any(spelling in named for link in _identity_chain(caller) for spelling in link)


def not_principal_exempts(not_principal: Any, caller: str) -> bool:
    """A NotPrincipal element leaves the caller out only when it names every identity AWS may
    check for it ("NotPrincipal": "AWS might validate the account first, then the role, and
    then the assumed-role user"); one of them missing, the Deny applies to the caller."""
    if not isinstance(not_principal, Mapping):
        return False
    named = set(_listed(not_principal.get("AWS")))
    chain = _identity_chain(caller)
    return bool(chain) and all(link & named for link in chain)


def _caller(caller: str | None) -> str:
    if caller is not None:
        return caller
    return (_lookup(CURRENT.get(), "aws:PrincipalArn") or [""])[0]


def bucket_policy_denies(
    policy: str | bytes | Mapping[str, Any] | None,
    action: str,
    resource: str,
    caller: str | None = None,
) -> str | None:
    """The Sid (or index) of the bucket policy's Deny that applies to this request, if any.
    ``caller``: the caller's ARN (an assumed-role session's own; by default the context's
    ``aws:PrincipalArn``)."""
    if not policy:
        return None
    document = policy if isinstance(policy, Mapping) else json.loads(policy)
    who = _caller(caller)
    for index, statement in enumerate(_statements(document)):
        if statement.get("Effect") != "Deny":
            continue
        if "NotPrincipal" in statement:
            if not_principal_exempts(statement["NotPrincipal"], who):
                continue
        elif not principal_matches(statement.get("Principal"), who):
            continue
        if statement_applies(statement, action, resource):
            return str(statement.get("Sid", index))
    return None


def _statements(document: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    statements = document.get("Statement", [])
    return [statements] if isinstance(statements, Mapping) else list(statements)


def decide(
    policies: Iterable[Mapping[str, Any]],
    action: str,
    resource: str,
    *,
    bucket_policy: str | bytes | Mapping[str, Any] | None = None,
    caller: str | None = None,
    context: Context | None = None,
) -> Decision:
    """A request as AWS's "Policy evaluation logic" decides it within one account: an explicit
    Deny in an identity policy or the bucket policy refuses; else an Allow in an identity policy
    allows; else it is implicitly denied. ``context`` replaces the current request context."""
    token = CURRENT.set(context) if context is not None else None
    try:
        allowed = False
        for document in policies:
            for statement in _statements(document):
                if not statement_applies(statement, action, resource):
                    continue
                if statement.get("Effect") == "Deny":
                    return Decision.EXPLICIT_DENY
                allowed = True
        if bucket_policy_denies(bucket_policy, action, resource, caller) is not None:
            return Decision.EXPLICIT_DENY
        return Decision.ALLOW if allowed else Decision.IMPLICIT_DENY
    finally:
        if token is not None:
            CURRENT.reset(token)


def trust_allows(document: Mapping[str, Any], caller: str, action: str, role_arn: str) -> bool:
    """A role's trust policy lets ``caller`` take it: a statement naming the caller allows the
    action and none denies it."""
    allowed = False
    for statement in _statements(document):
        if not principal_matches(statement.get("Principal"), caller):
            continue
        if not statement_applies(statement, action, role_arn):
            continue
        if statement.get("Effect") == "Deny":
            return False
        allowed = True
    return allowed


# -- refused at load ---------------------------------------------------------------------------

_TOP_ELEMENTS = frozenset({"Version", "Id", "Statement"})
_STATEMENT_ELEMENTS = frozenset({
    "Sid", "Effect", "Action", "NotAction", "Resource", "NotResource", "Principal",
    "NotPrincipal", "Condition",
})  # fmt: skip
_VERSIONS = frozenset({"2012-10-17", "2008-10-17"})
_PRINCIPAL_KINDS = {
    "identity": frozenset(),
    "trust": frozenset({"AWS", "Service"}),
    "bucket": frozenset({"AWS"}),
}


def validate_policy(document: Any, kind: PolicyKind = "identity") -> None:
    """Refuse (:class:`UnsupportedPolicy`, every problem named) a policy document this module
    would not evaluate as AWS does. ``kind``: an identity policy (a user's, group's or role's),
    a role's trust policy, or a bucket policy."""
    if isinstance(document, str | bytes):
        try:
            document = json.loads(document)
        except ValueError as err:
            raise UnsupportedPolicy([f"not JSON: {err}"]) from err
    if not isinstance(document, Mapping):
        raise UnsupportedPolicy(["a policy is a JSON object"])
    problems = [f"unknown element {name!r}" for name in document if name not in _TOP_ELEMENTS]
    if "Version" in document and document["Version"] not in _VERSIONS:
        problems.append(f"unknown Version {document['Version']!r}")
    statements = document.get("Statement", [])
    listed = [statements] if isinstance(statements, Mapping) else statements
    if not isinstance(listed, list):
        problems.append("Statement is neither an object nor a list")
        listed = []
    for index, statement in enumerate(listed):
        where = f"Statement[{index}]"
        if isinstance(statement, Mapping) and "Sid" in statement:
            where += f" ({statement['Sid']})"
        problems += [f"{where}: {p}" for p in _statement_problems(statement, kind)]
    if problems:
        raise UnsupportedPolicy(problems)


def _statement_problems(statement: Any, kind: PolicyKind) -> Iterator[str]:
    if not isinstance(statement, Mapping):
        yield "a statement is a JSON object"
        return
    for name in statement:
        if name not in _STATEMENT_ELEMENTS:
            yield f"unknown element {name!r}"
    effect = statement.get("Effect")
    if effect not in ("Allow", "Deny"):
        yield f"Effect {effect!r} is neither Allow nor Deny"
    if ("Action" in statement) == ("NotAction" in statement):
        yield "exactly one of Action and NotAction is needed"
    if "Resource" in statement and "NotResource" in statement:
        yield "Resource and NotResource together"
    if kind != "trust" and "Resource" not in statement and "NotResource" not in statement:
        yield "no Resource or NotResource"
    yield from _variable_problems(statement)
    yield from _principal_problems(statement, kind)
    condition = statement.get("Condition", {})
    if not isinstance(condition, Mapping):
        yield "Condition is not an object"
        return
    for operator, entries in condition.items():
        if not isinstance(entries, Mapping):
            yield f"{operator}: its keys and values are not an object"
            continue
        for key, wanted in entries.items():
            yield from _condition_problems(
                operator, key, wanted, kind, _not_emulated(statement, kind)
            )


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _variable_problems(statement: Mapping[str, Any]) -> Iterator[str]:
    """Policy variables (``${aws:username}``, ``${*}``...) are not substituted here."""
    for name in ("Action", "NotAction", "Resource", "NotResource", "Principal", "NotPrincipal"):
        for text in _strings(statement.get(name)):
            if "${" in text:
                yield f"{name} uses a policy variable ({text!r}), which is not implemented"
    for text in _strings(statement.get("Condition")):
        if "${" in text:
            yield f"Condition uses a policy variable ({text!r}), which is not implemented"


def _principal_problems(statement: Mapping[str, Any], kind: PolicyKind) -> Iterator[str]:
    has_principal, has_not = "Principal" in statement, "NotPrincipal" in statement
    if kind == "identity":
        if has_principal or has_not:
            yield "an identity policy names no Principal or NotPrincipal"
        return
    if has_principal and has_not:
        yield "Principal and NotPrincipal together"
    if kind == "trust":
        if has_not:
            yield "NotPrincipal cannot be used in a trust policy"
        elif not has_principal:
            yield "a trust policy statement needs a Principal"
    if kind == "bucket":
        if statement.get("Effect") == "Allow":
            yield "an Allow in a bucket policy is not applied by this emulator (denials only)"
        if not has_principal and not has_not:
            yield "a bucket policy statement needs a Principal or NotPrincipal"
    if has_principal:
        yield from _named_principal_problems(statement["Principal"], kind)
    if has_not:
        yield from _not_principal_problems(statement["NotPrincipal"], statement.get("Effect"))


def _named_principal_problems(principal: Any, kind: PolicyKind) -> Iterator[str]:
    if principal == "*":
        return
    if not isinstance(principal, Mapping):
        yield f"Principal {principal!r} is neither '*' nor an object"
        return
    for principal_kind, named in principal.items():
        if principal_kind not in _PRINCIPAL_KINDS[kind]:
            yield f"a {principal_kind} principal is not matched by this emulator"
            continue
        if principal_kind != "AWS":
            continue
        for arn in _listed(named):
            if arn == "*":
                continue
            account = bool(_ACCOUNT_ID.fullmatch(arn) or _ACCOUNT_ROOT.fullmatch(arn))
            if kind == "bucket" and account:
                yield f"account principal {arn!r} in a bucket policy is not matched here"
            elif not account and not (_IAM_ENTITY.fullmatch(arn) or _ASSUMED_ROLE.fullmatch(arn)):
                yield f"principal {arn!r} is not an account, user, role or session ARN"
            elif "*" in arn or "?" in arn:
                yield f"principal {arn!r}: a Principal takes no wildcards"


def _not_principal_problems(not_principal: Any, effect: Any) -> Iterator[str]:
    """ "NotPrincipal" documents one form: with Deny, naming AWS principals together with their
    account (and an assumed-role session together with its role); others have no documented
    outcome here."""
    if effect != "Deny":
        yield "NotPrincipal is supported with Deny only"
    if not isinstance(not_principal, Mapping) or set(not_principal) != {"AWS"}:
        yield "NotPrincipal must be {'AWS': [...]} here"
        return
    named = set(_listed(not_principal["AWS"]))
    for arn in sorted(named):
        if "*" in arn or "?" in arn:
            yield f"NotPrincipal {arn!r}: wildcards do not name a principal"
            continue
        if _ACCOUNT_ID.fullmatch(arn) or _ACCOUNT_ROOT.fullmatch(arn):
            continue
        if not (_IAM_ENTITY.fullmatch(arn) or _ASSUMED_ROLE.fullmatch(arn)):
            yield f"NotPrincipal {arn!r} is not an account, user, role or session ARN"
            continue
        chain = _identity_chain(arn)
        missing = [link for link in chain[:-1] if not link & named]
        if missing:
            yield (
                f"NotPrincipal names {arn!r} without {sorted(missing[0])[-1]!r}: AWS documents "
                "no outcome for that (name the account, and a session's role, too)"
            )


# services whose requests this emulator does not authorize as AWS would: Bedrock (the
# reporter's optional calls), whose API it does not run, and ECS (the scheduled tasks' RunTask),
# whose context keys (``ecs:cluster``) it does not supply. A statement whose every action is
# theirs never decides a request here, so the context keys of its conditions are not the
# emulator's to supply; a request to one of them, with policies enforced, is refused saying so
NOT_EMULATED_SERVICES = ("bedrock", "ecs")
# permissions no request names: AWS checks them inside another service's call (iam:PassRole
# when ECS starts a task with a role), so they never decide a request here either
NOT_EMULATED_ACTIONS = ("iam:passrole",)


def _not_emulated(statement: Mapping[str, Any], kind: PolicyKind = "identity") -> bool:
    principal = statement.get("Principal")
    if kind == "trust" and isinstance(principal, Mapping) and set(principal) == {"Service"}:
        # a role only an AWS service assumes (EventBridge Scheduler, ECS tasks): that service's
        # AssumeRole never reaches the emulator, so the keys it would carry are not its to supply
        return True
    actions = _listed(statement.get("Action"))
    return bool(actions) and all(
        str(a).split(":", 1)[0].lower() in NOT_EMULATED_SERVICES
        or str(a).lower() in NOT_EMULATED_ACTIONS
        for a in actions
    )


def _condition_problems(
    operator: str, key: str, wanted: Any, kind: PolicyKind, not_emulated: bool = False
) -> Iterator[str]:
    where = f"{operator} {key}"
    if operator.startswith(
        tuple(f"{q}{f}" for q in ("", *_SET_QUALIFIERS) for f in _NOT_IMPLEMENTED)
    ):
        yield f"{where}: {operator} is not implemented by this emulator"
        return
    values = wanted if isinstance(wanted, list) else [wanted]
    if not values or not all(isinstance(v, str | bool) for v in values):
        yield f"{where}: condition values must be strings or booleans"
    lowered = key.lower()
    known = SINGLE_VALUED_KEYS | MULTIVALUED_KEYS | (TRUST_KEYS if kind == "trust" else set())
    if lowered not in known and not (
        not_emulated and lowered.split(":", 1)[0] in (*NOT_EMULATED_SERVICES, "iam", "aws")
    ):
        yield f"{where}: the emulator puts no {key!r} in a request's context"
    if operator == "Null":
        if len(values) != 1 or str(values[0]).lower() not in ("true", "false"):
            yield f"{where}: Null takes true or false"
        return
    try:
        op = parse_operator(operator)
    except UnknownOperator:
        yield f"{where}: unknown condition operator {operator!r}"
        return
    if op.base == "Bool" and any(str(v).lower() not in ("true", "false") for v in values):
        yield f"{where}: Bool takes true or false"
    if lowered in MULTIVALUED_KEYS and not op.qualifier:
        yield (
            f"{where}: {key} is multivalued and needs ForAllValues: or ForAnyValue: (AWS "
            "documents no result for a plain operator on it)"
        )


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


# the calls whose request has a Select (Query, Scan) or a ReturnValues (the single-item writes)
_SELECTING = frozenset({"dynamodb:Query", "dynamodb:Scan"})
_RETURNING = frozenset({"dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"})


def dynamodb_context(
    request: Mapping[str, Any],
    hash_key: str | None,
    table: str | None = None,
    action: str | None = None,
) -> dict[str, list[str]]:
    """The DynamoDB condition keys of one request (or of one table's part of a batch).

    ``dynamodb:Select`` and ``dynamodb:ReturnValues`` are there even when the request leaves
    them out ("Using IAM policy conditions for fine-grained access control": "the Select
    parameter always has a value (ALL_ATTRIBUTES, unless otherwise specified)", "the
    ReturnValues parameter always has a value (NONE unless otherwise specified)"). A Query or
    Scan without Select counts as ALL_ATTRIBUTES (ALL_PROJECTED_ATTRIBUTES on an index) even
    with a ProjectionExpression: the page does not say which value a projection alone gives, and
    this is the stricter reading (a policy asking for SPECIFIC_ATTRIBUTES then needs it said)."""
    spec = request.get("RequestItems", {}).get(table) if table is not None else None
    items = _request_items(request, spec)
    attributes = _request_attributes(request)
    if isinstance(spec, Mapping):  # BatchGetItem: a table's projection is in its own part
        attributes |= _request_attributes(spec)
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
    if request.get("Select"):
        context["dynamodb:Select"] = [str(request["Select"])]
    elif action in _SELECTING:
        default = "ALL_PROJECTED_ATTRIBUTES" if request.get("IndexName") else "ALL_ATTRIBUTES"
        context["dynamodb:Select"] = [default]
    if request.get("ReturnValues"):
        context["dynamodb:ReturnValues"] = [str(request["ReturnValues"])]
    elif action in _RETURNING:
        context["dynamodb:ReturnValues"] = ["NONE"]
    return context


def _request_items(request: Mapping[str, Any], spec: Any) -> list[Mapping[str, Any]]:
    """The keys and items a request names: its own, or (``spec``) a batch's for one table."""
    items = [request[field] for field in ("Key", "Item") if field in request]
    if isinstance(spec, Mapping):  # BatchGetItem: {"Keys": [...]}
        return [*items, *spec.get("Keys", [])]
    for entry in spec or []:  # BatchWriteItem: puts and deletes
        for kind, field in (("PutRequest", "Item"), ("DeleteRequest", "Key")):
            if kind in entry:
                items.append(entry[kind][field])
    return items


# expression fields whose attribute names are part of ``dynamodb:Attributes``, and the legacy
# parameters whose keys are attribute names
_EXPRESSIONS = (
    "ProjectionExpression",
    "FilterExpression",
    "KeyConditionExpression",
    "ConditionExpression",
    "UpdateExpression",
)
_LEGACY_BY_NAME = ("AttributeUpdates", "Expected", "ScanFilter", "QueryFilter", "KeyConditions")
_TOKEN = re.compile(
    r"(?P<alias>#[A-Za-z0-9_]+)|(?P<value>:[A-Za-z0-9_]+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<other><>|<=|>=|\S)"
)
# the words of DynamoDB's expression grammar that are not attribute names
_KEYWORDS = frozenset({"set", "remove", "add", "delete", "and", "or", "not", "between", "in"})


def expression_names(expression: str, aliases: Mapping[str, str]) -> set[str]:
    """The attributes an expression names: the first element of each document path (``a`` of
    ``a.b[0].c``), an alias (``#a``) as the name it stands for, a function's arguments
    (``attribute_exists(x)``, ``size(x)``) but not the function; the grammar's keywords and
    ``:values`` are no names. An alias the request does not define stays as written, so a policy
    listing the allowed names refuses it."""
    tokens = [(m.lastgroup or "", m.group()) for m in _TOKEN.finditer(expression)]
    names: set[str] = set()
    for index, (kind, text) in enumerate(tokens):
        if kind not in ("alias", "name"):
            continue
        if index and tokens[index - 1][1] == ".":  # a nested element of a path
            continue
        following = tokens[index + 1][1] if index + 1 < len(tokens) else ""
        if kind == "name" and (text.lower() in _KEYWORDS or following == "("):
            continue
        names.add(aliases.get(text, text) if kind == "alias" else text)
    return names


def _request_attributes(request: Mapping[str, Any]) -> set[str]:
    """Attribute names a request reads, writes or tests by name (``dynamodb:Attributes``)."""
    aliases: Mapping[str, str] = request.get("ExpressionAttributeNames") or {}
    attributes: set[str] = set(aliases.values())
    for field in _EXPRESSIONS:
        attributes |= expression_names(request.get(field) or "", aliases)
    attributes.update(request.get("AttributesToGet") or [])
    for field in _LEGACY_BY_NAME:
        attributes.update(request.get(field) or {})
    return attributes


def _queried_partition(request: Mapping[str, Any], hash_key: str) -> list[str]:
    legacy = (request.get("KeyConditions") or {}).get(hash_key)
    if isinstance(legacy, Mapping):
        return [
            str(next(iter(v.values())))
            for v in legacy.get("AttributeValueList", [])
            if isinstance(v, Mapping) and v
        ]
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
