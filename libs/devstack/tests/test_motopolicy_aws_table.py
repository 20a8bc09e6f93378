"""The emulator's policy evaluator against a table of cases taken from AWS's IAM documentation:
each row is a policy (or a condition in an Allow), a request, the decision AWS documents and the
page and section it comes from. A row whose policy the emulator refuses at load expects
``refused``. The last tests put back, one at a time, mistakes an evaluator can make (and this
one made) and show that named rows of the table then fail: the table can tell."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest

from aegis_devstack import motopolicy
from aegis_devstack.motopolicy import UnsupportedPolicy, decide, principal_arn, validate_policy

# the pages (titles as in the IAM User Guide) and their sections
OPERATORS = "IAM JSON policy elements: Condition operators"
MISSING = f"{OPERATORS}, the note on keys not present in the request context"
IF_EXISTS = f"{OPERATORS}, ...IfExists condition operators"
NULL = f"{OPERATORS}, Condition operator to check existence of condition keys"
STRING = f"{OPERATORS}, String condition operators"
ARN = f"{OPERATORS}, Amazon Resource Name (ARN) condition operators"
NUMERIC = f"{OPERATORS}, Numeric condition operators"
DATE = f"{OPERATORS}, Date condition operators"
IP = f"{OPERATORS}, IP address condition operators"
MULTIPLE = "Conditions with multiple context keys or values, evaluation logic"
NEGATED = "Conditions with multiple context keys or values, negated matching condition operators"
SETS = "Single-valued vs. multivalued context keys, set operators for multivalued context keys"
MULTIVALUED = "Single-valued vs. multivalued context keys, key points"
CONDITION = "IAM JSON policy elements: Condition, key names are not case-sensitive"
ACTION = "IAM JSON policy elements: Action (prefix and action name are case insensitive)"
NOT_ACTION = "IAM JSON policy elements: NotAction"
NOT_RESOURCE = "IAM JSON policy elements: NotResource"
EVALUATION = "Policy evaluation logic, determining whether a request is allowed or denied"
NOT_PRINCIPAL = "AWS JSON policy elements: NotPrincipal, NotPrincipal with Deny"
VARIABLES = "IAM policy elements: Variables and tags (not implemented here: refused)"

ACCOUNT = "123456789012"
USER = f"arn:aws:iam::{ACCOUNT}:user/ops"
OTHER_USER = f"arn:aws:iam::{ACCOUNT}:user/intruder"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/aegis-raw-break-glass"
SESSION = f"arn:aws:sts::{ACCOUNT}:assumed-role/aegis-raw-break-glass/incident-42"
ROOT = f"arn:aws:iam::{ACCOUNT}:root"
OBJECT = "arn:aws:s3:::aegis-bucket/raw/f/m.json"
PROCESSED = "arn:aws:s3:::aegis-bucket/processed/f/m.json"
INM, ATTRS, LEADING = "s3:if-none-match", "dynamodb:Attributes", "dynamodb:LeadingKeys"
# the ARN operators' example: StringLike matches it, ArnLike (part by part) does not
FINANCE = "arn:aws:someservice:*:111122223333:finance/*"
STORE = "arn:aws:someservice:us-east-2:999999999999:store/abc:111122223333:finance/document.txt"


def allow(condition: dict[str, Any] | None = None, **statement: Any) -> dict[str, Any]:
    """An identity policy of one Allow (s3:GetObject on everything unless told otherwise)."""
    body: dict[str, Any] = {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}
    if condition is not None:
        body["Condition"] = condition
    return {"Version": "2012-10-17", "Statement": [{**body, **statement}]}


def deny(**statement: Any) -> dict[str, Any]:
    body = {"Effect": "Deny", "Action": "s3:GetObject", "Resource": "*", **statement}
    return {"Version": "2012-10-17", "Statement": [body]}


def bucket_deny_except(*named: str, effect: str = "Deny") -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "OnlyTheNamed",
                "Effect": effect,
                "NotPrincipal": {"AWS": list(named)},
                "Action": "s3:GetObject",
                "Resource": "arn:aws:s3:::aegis-bucket/*",
            }
        ],
    }


@dataclass(frozen=True)
class Row:
    name: str
    policies: tuple[dict[str, Any], ...]
    context: dict[str, list[str]]
    expected: str  # "allow", "implicit deny", "explicit deny" or "refused"
    source: str
    action: str = "s3:GetObject"
    resource: str = OBJECT
    caller: str = USER
    bucket_policy: dict[str, Any] | None = field(default=None)


def condition_row(
    name: str, condition: dict[str, Any], context: dict[str, list[str]], holds: bool, source: str
) -> Row:
    """A condition in an Allow: it holds (allow) or not (implicit deny)."""
    return Row(name, (allow(condition),), context, "allow" if holds else "implicit deny", source)


def refused_row(name: str, policy: dict[str, Any], source: str) -> Row:
    return Row(name, (policy,), {}, "refused", source)


ROWS: list[Row] = [
    # a key missing from the request
    condition_row(
        "missing key: StringEquals is false", {"StringEquals": {INM: "*"}}, {}, False, MISSING
    ),
    condition_row(
        "missing key: StringLike is false", {"StringLike": {INM: "*"}}, {}, False, MISSING
    ),
    condition_row(
        "missing key: ArnLike is false",
        {"ArnLike": {"aws:PrincipalArn": "*"}},
        {"aws:PrincipalArn": []},
        False,
        MISSING,
    ),
    condition_row(
        "missing key: Bool is false", {"Bool": {"aws:SecureTransport": "true"}}, {}, False, MISSING
    ),
    condition_row(
        "missing key: StringNotEquals is true", {"StringNotEquals": {INM: "*"}}, {}, True, MISSING
    ),
    condition_row(
        "missing key: StringNotEqualsIgnoreCase is true",
        {"StringNotEqualsIgnoreCase": {INM: "*"}},
        {},
        True,
        MISSING,
    ),
    condition_row(
        "missing key: StringNotLike is true", {"StringNotLike": {INM: "*"}}, {}, True, MISSING
    ),
    condition_row(
        "missing key: ArnNotEquals is true",
        {"ArnNotEquals": {"aws:PrincipalArn": ROLE}},
        {"aws:PrincipalArn": []},
        True,
        MISSING,
    ),
    condition_row(
        "missing key: ArnNotLike is true",
        {"ArnNotLike": {"aws:PrincipalArn": ROLE}},
        {"aws:PrincipalArn": []},
        True,
        MISSING,
    ),
    # ...IfExists
    condition_row(
        "IfExists: missing key holds",
        {"StringEqualsIfExists": {"dynamodb:Select": "SPECIFIC_ATTRIBUTES"}},
        {},
        True,
        IF_EXISTS,
    ),
    condition_row(
        "IfExists: present and equal holds",
        {"StringEqualsIfExists": {"dynamodb:Select": "SPECIFIC_ATTRIBUTES"}},
        {"dynamodb:Select": ["SPECIFIC_ATTRIBUTES"]},
        True,
        IF_EXISTS,
    ),
    condition_row(
        "IfExists: present and different fails",
        {"StringEqualsIfExists": {"dynamodb:Select": "SPECIFIC_ATTRIBUTES"}},
        {"dynamodb:Select": ["ALL_ATTRIBUTES"]},
        False,
        IF_EXISTS,
    ),
    condition_row(
        "IfExists negated: missing key holds",
        {"StringNotEqualsIfExists": {INM: "*"}},
        {},
        True,
        IF_EXISTS,
    ),
    condition_row(
        "IfExists negated: present and equal fails",
        {"StringNotEqualsIfExists": {INM: "*"}},
        {INM: ["*"]},
        False,
        IF_EXISTS,
    ),
    condition_row(
        "IfExists negated: present and different holds",
        {"StringNotEqualsIfExists": {INM: "*"}},
        {INM: ["abc"]},
        True,
        IF_EXISTS,
    ),
    # Null
    condition_row("Null true: key missing holds", {"Null": {INM: "true"}}, {}, True, NULL),
    condition_row(
        "Null true: key present fails", {"Null": {INM: "true"}}, {INM: ["*"]}, False, NULL
    ),
    condition_row(
        "Null false: key present holds", {"Null": {INM: "false"}}, {INM: ["*"]}, True, NULL
    ),
    condition_row("Null false: key missing fails", {"Null": {INM: "false"}}, {}, False, NULL),
    # set operators on a multivalued key
    condition_row(
        "ForAllValues: missing key holds",
        {"ForAllValues:StringEquals": {ATTRS: ["pk", "sk"]}},
        {},
        True,
        SETS,
    ),
    condition_row(
        "ForAllValues: empty set holds",
        {"ForAllValues:StringEquals": {ATTRS: ["pk", "sk"]}},
        {ATTRS: []},
        True,
        SETS,
    ),
    condition_row(
        "ForAllValues: every value listed holds",
        {"ForAllValues:StringEquals": {ATTRS: ["pk", "sk"]}},
        {ATTRS: ["pk", "sk"]},
        True,
        SETS,
    ),
    condition_row(
        "ForAllValues: one value unlisted fails",
        {"ForAllValues:StringEquals": {ATTRS: ["pk", "sk"]}},
        {ATTRS: ["pk", "payload"]},
        False,
        SETS,
    ),
    condition_row(
        "ForAnyValue: missing key fails",
        {"ForAnyValue:StringEquals": {ATTRS: ["payload"]}},
        {},
        False,
        SETS,
    ),
    condition_row(
        "ForAnyValue: empty set fails",
        {"ForAnyValue:StringEquals": {ATTRS: ["payload"]}},
        {ATTRS: []},
        False,
        SETS,
    ),
    condition_row(
        "ForAnyValue: one value listed holds",
        {"ForAnyValue:StringEquals": {ATTRS: ["payload"]}},
        {ATTRS: ["pk", "payload"]},
        True,
        SETS,
    ),
    condition_row(
        "ForAnyValue: no value listed fails",
        {"ForAnyValue:StringEquals": {ATTRS: ["payload"]}},
        {ATTRS: ["pk", "sk"]},
        False,
        SETS,
    ),
    condition_row(
        "ForAllValues negated: missing key holds",
        {"ForAllValues:StringNotLike": {LEADING: "ALERT#*"}},
        {},
        True,
        SETS,
    ),
    condition_row(
        "ForAllValues negated: no value matches holds",
        {"ForAllValues:StringNotLike": {LEADING: "ALERT#*"}},
        {LEADING: ["FACTORY#a", "JOB#b"]},
        True,
        SETS,
    ),
    condition_row(
        "ForAllValues negated: one value matches fails",
        {"ForAllValues:StringNotLike": {LEADING: "ALERT#*"}},
        {LEADING: ["FACTORY#a", "ALERT#a"]},
        False,
        SETS,
    ),
    condition_row(
        "ForAnyValue negated: missing key fails",
        {"ForAnyValue:StringNotLike": {LEADING: "ALERT#*"}},
        {},
        False,
        SETS,
    ),
    condition_row(
        "ForAnyValue negated: one value does not match holds",
        {"ForAnyValue:StringNotLike": {LEADING: "ALERT#*"}},
        {LEADING: ["ALERT#a", "FACTORY#a"]},
        True,
        SETS,
    ),
    condition_row(
        "ForAnyValue negated: every value matches fails",
        {"ForAnyValue:StringNotLike": {LEADING: "ALERT#*"}},
        {LEADING: ["ALERT#a", "ALERT#b"]},
        False,
        SETS,
    ),
    # names and values
    condition_row(
        "key names are case-insensitive",
        {"StringEquals": {"S3:If-None-Match": "*"}},
        {INM: ["*"]},
        True,
        CONDITION,
    ),
    condition_row(
        "StringEquals values are case-sensitive",
        {"StringEquals": {"dynamodb:Select": "count"}},
        {"dynamodb:Select": ["COUNT"]},
        False,
        STRING,
    ),
    condition_row(
        "StringEqualsIgnoreCase ignores the case of values",
        {"StringEqualsIgnoreCase": {"dynamodb:Select": "count"}},
        {"dynamodb:Select": ["COUNT"]},
        True,
        STRING,
    ),
    condition_row(
        "StringLike: * matches any run",
        {"StringLike": {INM: "a*c"}},
        {INM: ["abbbc"]},
        True,
        STRING,
    ),
    condition_row(
        "StringLike: ? matches one character",
        {"StringLike": {INM: "f-?"}},
        {INM: ["f-1"]},
        True,
        STRING,
    ),
    condition_row(
        "StringLike: ? matches no more than one",
        {"StringLike": {INM: "f-?"}},
        {INM: ["f-12"]},
        False,
        STRING,
    ),
    condition_row(
        "StringLike: other characters are literal",
        {"StringLike": {INM: "a.c"}},
        {INM: ["abc"]},
        False,
        STRING,
    ),
    condition_row(
        "StringLike matches across colons",
        {"StringLike": {"aws:PrincipalArn": FINANCE}},
        {"aws:PrincipalArn": [STORE]},
        True,
        ARN,
    ),
    condition_row(
        "ArnLike matches each of the six parts on its own",
        {"ArnLike": {"aws:PrincipalArn": FINANCE}},
        {"aws:PrincipalArn": [STORE]},
        False,
        ARN,
    ),
    condition_row(
        "ArnLike: wildcards within parts",
        {"ArnLike": {"aws:PrincipalArn": "arn:aws:iam::*:role/aegis-*"}},
        {"aws:PrincipalArn": [ROLE]},
        True,
        ARN,
    ),
    condition_row(
        "ArnEquals behaves as ArnLike",
        {"ArnEquals": {"aws:PrincipalArn": "arn:*:iam::123456789012:role/aegis-raw-break-glas?"}},
        {"aws:PrincipalArn": [ROLE]},
        True,
        ARN,
    ),
    condition_row(
        "ArnLike: another resource type fails",
        {"ArnLike": {"aws:PrincipalArn": "arn:aws:iam::*:user/*"}},
        {"aws:PrincipalArn": [ROLE]},
        False,
        ARN,
    ),
    # several values, keys and operators
    condition_row(
        "values of one key are ORed",
        {"StringEquals": {INM: ["abc", "*"]}},
        {INM: ["*"]},
        True,
        MULTIPLE,
    ),
    condition_row(
        "values of a negated operator are NORed: one equal fails",
        {"StringNotEquals": {INM: ["abc", "*"]}},
        {INM: ["*"]},
        False,
        NEGATED,
    ),
    condition_row(
        "values of a negated operator are NORed: none equal holds",
        {"StringNotEquals": {INM: ["abc", "*"]}},
        {INM: ["xyz"]},
        True,
        NEGATED,
    ),
    condition_row(
        "keys of one operator are ANDed",
        {"StringEquals": {INM: "*", "s3:if-match": "e1"}},
        {INM: ["*"], "s3:if-match": ["e2"]},
        False,
        MULTIPLE,
    ),
    condition_row(
        "operators are ANDed: both hold",
        {"StringEquals": {INM: "*"}, "Bool": {"aws:SecureTransport": "true"}},
        {INM: ["*"], "aws:SecureTransport": ["true"]},
        True,
        MULTIPLE,
    ),
    condition_row(
        "operators are ANDed: one fails",
        {"StringEquals": {INM: "*"}, "Bool": {"aws:SecureTransport": "true"}},
        {INM: ["*"], "aws:SecureTransport": ["false"]},
        False,
        MULTIPLE,
    ),
    # statements and policies
    Row("an explicit deny overrides an allow", (allow(), deny()), {}, "explicit deny", EVALUATION),
    Row(
        "a deny in the bucket policy overrides the identity's allow",
        (allow(),),
        {},
        "explicit deny",
        EVALUATION,
        bucket_policy=bucket_deny_except(ROLE, ROOT),
    ),
    Row(
        "no applicable statement: implicit deny",
        (allow(Action="s3:PutObject"),),
        {},
        "implicit deny",
        EVALUATION,
    ),
    Row(
        "actions match without regard to case", (allow(Action="S3:getobject"),), {}, "allow", ACTION
    ),
    Row(
        "NotAction allows every other action",
        (allow(NotAction="s3:DeleteObject", Action=None),),
        {},
        "allow",
        NOT_ACTION,
    ),
    Row(
        "NotAction does not allow the actions it names",
        (allow(NotAction="s3:DeleteObject", Action=None),),
        {},
        "implicit deny",
        NOT_ACTION,
        action="s3:DeleteObject",
    ),
    Row(
        "NotResource denies everywhere but the named resources",
        (allow(), deny(NotResource="arn:aws:s3:::aegis-bucket/processed/*", Resource=None)),
        {},
        "explicit deny",
        NOT_RESOURCE,
    ),
    Row(
        "NotResource does not deny the named resources",
        (allow(), deny(NotResource="arn:aws:s3:::aegis-bucket/processed/*", Resource=None)),
        {},
        "allow",
        NOT_RESOURCE,
        resource=PROCESSED,
    ),
    # NotPrincipal
    Row(
        "NotPrincipal: a user named with its account is left out",
        (allow(),),
        {},
        "allow",
        NOT_PRINCIPAL,
        bucket_policy=bucket_deny_except(USER, ROOT),
    ),
    Row(
        "NotPrincipal: anyone else is denied",
        (allow(),),
        {},
        "explicit deny",
        NOT_PRINCIPAL,
        caller=OTHER_USER,
        bucket_policy=bucket_deny_except(USER, ROOT),
    ),
    Row(
        "NotPrincipal: a session named with its role and account is left out",
        (allow(),),
        {},
        "allow",
        NOT_PRINCIPAL,
        caller=SESSION,
        bucket_policy=bucket_deny_except(SESSION, ROLE, ROOT),
    ),
    Row(
        "NotPrincipal: a role does not name its sessions",
        (allow(),),
        {},
        "explicit deny",
        NOT_PRINCIPAL,
        caller=SESSION,
        bucket_policy=bucket_deny_except(ROLE, ROOT),
    ),
    Row(
        "NotPrincipal: a user without its account is refused",
        (allow(),),
        {},
        "refused",
        NOT_PRINCIPAL,
        bucket_policy=bucket_deny_except(USER),
    ),
    Row(
        "NotPrincipal: a session without its role is refused",
        (allow(),),
        {},
        "refused",
        NOT_PRINCIPAL,
        caller=SESSION,
        bucket_policy=bucket_deny_except(SESSION, ROOT),
    ),
    Row(
        "NotPrincipal with Allow is refused",
        (allow(),),
        {},
        "refused",
        "AWS JSON policy elements: NotPrincipal, NotPrincipal with Allow",
        bucket_policy=bucket_deny_except(USER, ROOT, effect="Allow"),
    ),
    # what the evaluator refuses at load
    refused_row(
        "a plain operator on a multivalued key is refused (StringLike)",
        allow({"StringLike": {LEADING: "FACTORY#*"}}),
        MULTIVALUED,
    ),
    refused_row(
        "a plain operator on a multivalued key is refused (StringEquals)",
        allow({"StringEquals": {ATTRS: ["pk"]}}),
        MULTIVALUED,
    ),
    refused_row("a numeric operator is refused", allow({"NumericLessThan": {INM: "3"}}), NUMERIC),
    refused_row(
        "a date operator is refused",
        allow({"DateGreaterThan": {INM: "2020-01-01T00:00:00Z"}}),
        DATE,
    ),
    refused_row("an IP address operator is refused", allow({"IpAddress": {INM: "10.0.0.0/8"}}), IP),
    refused_row(
        "a policy variable in a resource is refused",
        allow(Resource="arn:aws:s3:::aegis-bucket/${aws:username}/*"),
        VARIABLES,
    ),
    refused_row(
        "a policy variable in a condition is refused",
        allow({"StringEquals": {INM: "${aws:username}"}}),
        VARIABLES,
    ),
]


def _without_none(document: dict[str, Any]) -> dict[str, Any]:
    statements = [{k: v for k, v in s.items() if v is not None} for s in document["Statement"]]
    return {**document, "Statement": statements}


def outcome(row: Row) -> str:
    """What the emulator decides for a row: ``refused`` if a policy fails validation, else the
    decision of :func:`aegis_devstack.motopolicy.decide`."""
    policies = [_without_none(p) for p in row.policies]
    try:
        for policy in policies:
            validate_policy(policy, "identity")
        if row.bucket_policy is not None:
            validate_policy(row.bucket_policy, "bucket")
    except UnsupportedPolicy:
        return "refused"
    context = {"aws:PrincipalArn": [principal_arn(row.caller)], **row.context}
    decided = decide(
        policies,
        row.action,
        row.resource,
        bucket_policy=row.bucket_policy,
        caller=row.caller,
        context=context,
    )
    return decided.value


def failures(rows: Iterable[Row]) -> dict[str, str]:
    """Row name -> what went wrong, for every row whose outcome is not the documented one."""
    found = {}
    for row in rows:
        got = outcome(row)
        if got != row.expected:
            found[row.name] = f"expected {row.expected}, got {got} ({row.source})"
    return found


def test_the_table_covers_at_least_forty_documented_cases_each_with_its_source():
    assert len(ROWS) >= 40
    assert len({r.name for r in ROWS}) == len(ROWS)
    assert all(r.source for r in ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_the_evaluator_decides_each_row_as_aws_documents(row):
    assert outcome(row) == row.expected, row.source


# -- the table catches the mistakes an evaluator can make --------------------------------------


def test_a_negated_operator_failing_on_a_missing_key_fails_the_missing_key_rows(monkeypatch):
    """The rule this evaluator had: a missing key fails every operator but IfExists and
    ForAllValues (AWS: negated operators hold)."""
    monkeypatch.setattr(
        motopolicy,
        "_missing_key_holds",
        lambda op: op.if_exists or op.qualifier == "ForAllValues:",
    )
    failed = failures(ROWS)
    assert {
        "missing key: StringNotEquals is true",
        "missing key: StringNotEqualsIgnoreCase is true",
        "missing key: StringNotLike is true",
        "missing key: ArnNotEquals is true",
        "missing key: ArnNotLike is true",
    } <= set(failed), failed


def test_forallvalues_failing_on_a_missing_key_fails_the_vacuous_rows(monkeypatch):
    monkeypatch.setattr(motopolicy, "_missing_key_holds", lambda op: op.if_exists)
    failed = failures(ROWS)
    assert {
        "ForAllValues: missing key holds",
        "ForAllValues: empty set holds",
        "ForAllValues negated: missing key holds",
    } <= set(failed), failed


def test_negated_values_ored_instead_of_nored_fails_the_nor_rows(monkeypatch):
    def any_not_equal(op: motopolicy.Operator, wanted: list[str], value: str) -> bool:
        found = [motopolicy._match_one(op.positive, w, value) for w in wanted]
        return any(not f for f in found) if op.negated else any(found)

    monkeypatch.setattr(motopolicy, "_value_matches", any_not_equal)
    failed = failures(ROWS)
    assert "values of a negated operator are NORed: one equal fails" in failed, failed


def test_case_sensitive_key_names_fail_the_case_insensitive_row(monkeypatch):
    monkeypatch.setattr(motopolicy, "_lookup", lambda context, key: context.get(key))
    failed = failures(ROWS)
    assert "key names are case-insensitive" in failed, failed


def test_a_role_naming_its_sessions_in_notprincipal_fails_the_session_row(monkeypatch):
    """A NotPrincipal that left a session out because its role is named (AWS: the session
    itself must be named)."""
    chain = motopolicy._identity_chain

    def role_suffices(caller: str) -> list[set[str]]:
        links = chain(caller)
        return links[:-1] if len(links) == 3 else links

    monkeypatch.setattr(motopolicy, "_identity_chain", role_suffices)
    failed = failures(ROWS)
    assert "NotPrincipal: a role does not name its sessions" in failed, failed


def test_arn_operators_matched_as_whole_strings_fail_the_per_part_row(monkeypatch):
    monkeypatch.setattr(
        motopolicy,
        "_arn_like",
        lambda pattern, value: motopolicy._wildcard(pattern).fullmatch(value),
    )
    failed = failures(ROWS)
    assert "ArnLike matches each of the six parts on its own" in failed, failed
