"""The one decision: roles, scopes and patterns, and what belongs to no factory."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from aegis_contracts.people import (
    Act,
    Identity,
    Role,
    covers,
    decide,
    factory_of,
    parse_scope,
    visible,
)


def person(role: Role, *scope: str) -> Identity:
    return Identity(subject="s-1", name="Kim", via="oidc", role=role, scope=scope)


@pytest.mark.parametrize(
    ("role", "act", "allowed"),
    [
        (Role.VIEWER, Act.READ, True),
        (Role.VIEWER, Act.RESPOND, False),
        (Role.VIEWER, Act.SILENCE, False),
        (Role.VIEWER, Act.ADMINISTER, False),
        (Role.RESPONDER, Act.READ, True),
        (Role.RESPONDER, Act.RESPOND, True),
        (Role.RESPONDER, Act.SILENCE, True),
        (Role.RESPONDER, Act.ADMINISTER, False),
        (Role.ADMIN, Act.ADMINISTER, True),
    ],
)
def test_each_role_does_what_its_rank_allows_on_a_factory_of_its_scope(
    role: Role, act: Act, allowed: bool
) -> None:
    decision = decide(person(role, "factory-a"), act, "factory-a")
    assert decision.allowed is allowed
    if not allowed:
        assert decision.status == 403 and "role" in decision.reason


@pytest.mark.parametrize("act", list(Act))
def test_a_factory_out_of_scope_is_refused_as_not_found_for_every_act(act: Act) -> None:
    for role in (Role.VIEWER, Role.RESPONDER):
        decision = decide(person(role, "factory-a", "plant-*"), act, "factory-b")
        assert (decision.allowed, decision.status) == (False, 404)
        assert "factory-a" not in decision.reason  # names only what was asked for


def test_patterns_match_whole_ids_case_sensitively() -> None:
    scope = parse_scope("plant-*,site-?")
    assert covers(scope, "plant-7") and covers(scope, "site-3")
    assert not covers(scope, "Plant-7")  # factory ids are case-sensitive
    assert not covers(scope, "site-33") and not covers(scope, "xplant-7")
    assert not covers(("factory-a",), "factory-ab")


def test_the_fleet_scope_and_the_admin_role_see_every_factory_and_the_platform() -> None:
    for who in (person(Role.VIEWER, "*"), person(Role.ADMIN)):
        assert decide(who, Act.READ, "any-factory")
        assert decide(who, Act.READ, None)
    assert visible(person(Role.VIEWER, "a", "c"), ["a", "b", "c"]) == ["a", "c"]


def test_what_belongs_to_no_factory_needs_the_whole_fleet_in_scope() -> None:
    scoped = person(Role.RESPONDER, "factory-a")
    assert decide(scoped, Act.READ, None).status == 403
    assert decide(scoped, Act.RESPOND, factory_of("cloud-infra")).status == 403
    assert decide(person(Role.RESPONDER, "*"), Act.RESPOND, factory_of("cloud-infra"))
    assert factory_of("factory-a") == "factory-a"


def test_an_empty_scope_covers_nothing_and_a_malformed_entry_is_refused_naming_it() -> None:
    assert not decide(person(Role.VIEWER), Act.READ, "factory-a")
    with pytest.raises(ValueError, match="'a/b'"):
        parse_scope("ok,a/b")
    with pytest.raises(ValidationError, match=r"\[x\]"):
        Identity(subject="s", name="n", via="token", role=Role.VIEWER, scope=("[x]",))
    assert parse_scope(" a , a ,b,") == ("a", "b")
