"""The roles file and the identity a provider's claims make (pure: no provider, no table)."""

from __future__ import annotations

from typing import Any

import pytest

from aegis_contracts.people import Identity, Role
from aegis_dashboard_api.roles import RolesFileError, identity_from_claims, parse_roles

ROLES = """
groups_claim = "groups"

[[rule]]
group = "aegis-admins"
role = "admin"

[[rule]]
group = "north-viewers"
role = "viewer"
factories = ["north-*"]

[[rule]]
group = "south-responders"
role = "responder"
factories = ["south-1", "south-2", "north-*"]
"""
MAPPING = parse_roles(ROLES)


def claims(*groups: str, **more: Any) -> dict[str, Any]:
    return {"sub": "u-1", "name": "Kim Ji-woo", "groups": list(groups), **more}


@pytest.mark.parametrize(
    ("groups", "role", "scope"),
    [
        (["north-viewers"], Role.VIEWER, ("north-*",)),
        (["south-responders"], Role.RESPONDER, ("south-1", "south-2", "north-*")),
        # several rules: the highest role, the union of the scopes (each entry once, in order)
        (["north-viewers", "south-responders"], Role.RESPONDER, ("north-*", "south-1", "south-2")),
        (["south-responders", "aegis-admins"], Role.ADMIN, ("south-1", "south-2", "north-*")),
        (["aegis-admins", "marketing"], Role.ADMIN, ()),
    ],
)
def test_groups_give_the_highest_role_of_their_rules_and_every_scope(
    groups: list[str], role: Role, scope: tuple[str, ...]
) -> None:
    identity = identity_from_claims(claims(*groups), MAPPING)
    assert identity == Identity(
        subject="u-1", name="Kim Ji-woo", via="oidc", role=role, scope=scope
    )


@pytest.mark.parametrize(
    "person",
    [
        claims("marketing"),
        claims(),
        {"sub": "u-1", "name": "no groups claim"},
        claims("aegis-admins", sub=""),
        {"name": "no sub", "groups": ["aegis-admins"]},
        claims("aegis-admins", sub="x" * 257),
        claims(groups={"aegis-admins": True}),  # not a list of groups
    ],
)
def test_a_person_no_rule_matches_or_without_a_subject_gets_no_identity(
    person: dict[str, Any],
) -> None:
    assert identity_from_claims(person, MAPPING) is None


def test_the_groups_claim_is_the_one_the_file_names_and_one_string_is_one_group() -> None:
    cognito = parse_roles(
        'groups_claim = "cognito:groups"\n[[rule]]\ngroup = "ops"\nrole = "viewer"'
    )
    assert identity_from_claims({"sub": "u", "cognito:groups": "ops"}, cognito) is not None
    assert identity_from_claims({"sub": "u", "groups": ["ops"]}, cognito) is None


@pytest.mark.parametrize(
    ("extra", "name"),
    [
        ({"name": " Kim ", "email": "kim@example.com"}, "Kim"),
        ({"preferred_username": "kim", "email": "kim@example.com"}, "kim"),
        ({"email": "kim@example.com"}, "kim@example.com"),
        ({"name": "   "}, "u-1"),
    ],
)
def test_the_name_is_name_else_username_else_email_else_the_subject(
    extra: dict[str, str], name: str
) -> None:
    person = {"sub": "u-1", "groups": ["north-viewers"], **extra}
    identity = identity_from_claims(person, MAPPING)
    assert identity is not None and identity.name == name


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[[rule]]\ngroup = 'a'\nrole = 'owner'", "rule.0.role"),
        ("[[rule]]\ngroup = 'a'\nrole = 'viewer'\nfactories = ['../x']", "rule.0.factories"),
        ("[[rule]]\ngroup = 'a'\nrole = 'viewer'\nfactory = ['a']", "rule.0.factory"),
        ("[[rule]]\nrole = 'viewer'", "rule.0.group"),
        ("groups = 'x'", "groups"),
        ("[[rule]\n", "not TOML"),
    ],
)
def test_a_wrong_roles_file_is_refused_naming_what_is_wrong(text: str, named: str) -> None:
    with pytest.raises(RolesFileError, match=named.replace(".", r"\.")):
        parse_roles(text, source="roles.toml")
