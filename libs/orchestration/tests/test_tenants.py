"""The tenants file: each tenant's scope of factories (ids, patterns, a comma-separated text, or
none), every mistake named, and the refusal of a job whose tenant it does not declare."""

from __future__ import annotations

from pathlib import Path

import pytest

from aegis_orchestration.model import Job
from aegis_orchestration.tenants import Tenants, TenantsFileError, load_tenants, parse_tenants


def a_job(tenant: str | None) -> Job:
    return Job.model_validate(
        {
            "id": "j1",
            "job_name": "j1",
            "trigger_type": "Automation",
            "tenant": tenant,
            "steps": [{"id": "a", "step_type": "DUMMY", "is_start_point": True}],
        }
    )


def test_each_tenant_gets_its_scope(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(
        "tenants:\n"
        '  aegis/plant-ops: [factory-a, "north-*"]\n'
        '  contractors: "factory-c, factory-d"\n'
        "  aegis/audit: []\n"
    )
    tenants = load_tenants(path)
    assert tenants.scopes == {
        "aegis/plant-ops": ("factory-a", "north-*"),
        "contractors": ("factory-c", "factory-d"),
        "aegis/audit": (),
    }
    assert tenants.source == str(path)
    assert load_tenants(None) == Tenants()
    assert parse_tenants("") == Tenants()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("tenants: [a]", "'tenants' is a mapping of tenant to factories"),
        ("other: {}", "expected a mapping with one key, 'tenants'"),
        ("tenants:\n  a: [x]\n  a: [y]\n", "'a' is given twice (line 3)"),
        ("tenants:\n  a b: [x]\n", "'a b' is no tenant"),
        ("tenants:\n  a/b/c: [x]\n", "'a/b/c' is no tenant"),
        ("tenants:\n  a:\n", "a: a list of factory ids or patterns ([] for none)"),
        ("tenants:\n  a: [f!]\n", "a: 'f!' is neither a factory id nor a pattern"),
        ("tenants: {a: [x]", "is not YAML"),
    ],
)
def test_a_wrong_tenants_file_is_refused_naming_the_mistake(text: str, reason: str) -> None:
    with pytest.raises(TenantsFileError, match=r"^the tenants file t\.yaml") as caught:
        parse_tenants(text, source="t.yaml")
    assert reason in str(caught.value)


def test_a_missing_tenants_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TenantsFileError, match=r"the tenants file .*absent.yaml cannot be read"):
        load_tenants(tmp_path / "absent.yaml")


def test_a_job_of_an_undeclared_tenant_is_refused_naming_the_tenant() -> None:
    declared = Tenants({"aegis/plant-ops": ("factory-a",)}, "tenants.yaml")
    assert declared.refusal(a_job("aegis/plant-ops")) is None
    assert declared.refusal(a_job(None)) is None  # no tenant: not concerned
    assert declared.refusal(a_job("aegis/other")) == (
        "job j1 belongs to tenant 'aegis/other', which the tenants file tenants.yaml does not "
        "declare"
    )
    assert Tenants().refusal(a_job("aegis/other")) == (
        "job j1 belongs to tenant 'aegis/other', and no tenants file declares it "
        "(AEGIS_ORCHESTRATOR_TENANTS_FILE is not set)"
    )
