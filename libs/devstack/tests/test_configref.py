"""aegis_devstack.configref on made-up settings: the reference's rules (one name per meaning, a
description for every field, old names after the new one) and how values are written. The
committed reference of the real settings is checked in tests/integration/test_configref.py."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import AliasChoices, Field
from pydantic_settings import NoDecode

from aegis_devstack.configref import (
    Component,
    ConfigRefError,
    build,
    render_names,
    render_reference,
    settings_class_of,
)
from aegis_runtime.settings import AegisSettings


class PumpSettings(AegisSettings):
    service: str = "pump"
    pump_batch_size: int = Field(
        default=16,
        ge=1,
        le=256,
        validation_alias=AliasChoices("AEGIS_PUMP_BATCH_SIZE", "AEGIS_BATCH_SIZE"),
        description="Messages fetched at a time.",
    )
    pump_zones: Annotated[list[Literal["a", "b"]], NoDecode] = Field(
        default=["a", "b"], min_length=1, description="Zones, comma-separated."
    )
    pump_hooks: list[str] = Field(default_factory=list, description="Hooks | as JSON.")
    pump_rules: Path | None = Field(default=None, description="The rules.\n  Unset: built in.")
    shared_gap_s: float = Field(default=60.0, gt=0, description="A gap, seconds.")


class ValveSettings(AegisSettings):
    service: str = "valve"
    shared_gap_s: float = Field(default=60.0, gt=0, description="A gap, seconds.")
    aws_max_attempts: int = Field(default=3, ge=1, le=10, description="Its own attempts.")


def components(*pairs: tuple[str, type[AegisSettings]]) -> list[Component]:
    return [
        Component(name, "command" if name.startswith("cmd-") else "service", cls)
        for name, cls in pairs
    ]


def test_the_reference_lists_each_variable_once_with_who_reads_it() -> None:
    ref = build(
        components(("pump", PumpSettings), ("valve", ValveSettings), ("cmd-x", PumpSettings))
    )
    text = render_reference(ref)
    assert "| `AEGIS_BUCKET` | text | `aegis-bucket-data` |" in text
    # the shared setting whose default each component overrides
    assert (
        "| `AEGIS_SERVICE` | text | `aegis`; in each component its own: `pump`, `valve` |" in text
    )
    # a shared setting one component gives another default: named with it
    assert "| `AEGIS_AWS_MAX_ATTEMPTS` | integer, 1 to 10 | 5; `valve`: 3 |" in text
    # declared by two classes with one meaning: once, under "Shared by some services"
    assert text.count("`AEGIS_SHARED_GAP_S`") == 1
    assert "| `AEGIS_SHARED_GAP_S` | `pump`, `valve` and `aegis cmd-x` | number, > 0 | 60 |" in text
    assert "## pump\n\nRead by `pump` and `aegis cmd-x`." in text
    assert (
        "| `AEGIS_PUMP_BATCH_SIZE` | integer, 1 to 256 | 16 | Messages fetched at a time. |" in text
    )
    assert "| `AEGIS_PUMP_ZONES` | comma-separated list of `a`, `b`, not empty | `a,b` |" in text
    assert "| `AEGIS_PUMP_HOOKS` | JSON list of text | empty | Hooks \\| as JSON. |" in text
    assert "| `AEGIS_PUMP_RULES` | path | unset | The rules. Unset: built in. |" in text
    assert "| `AEGIS_BATCH_SIZE` | `AEGIS_PUMP_BATCH_SIZE` | `pump` and `aegis cmd-x` |" in text


def test_the_names_module_holds_current_names_families_and_deprecated_ones() -> None:
    ref = build(components(("pump", PumpSettings)))
    namespace: dict[str, object] = {}
    exec(render_names(ref), namespace)  # the generated module, run as Python
    known = namespace["KNOWN"]
    assert isinstance(known, frozenset)
    assert {"AEGIS_PUMP_BATCH_SIZE", "AEGIS_BUCKET", "AEGIS_BROKER_ACL_FILE"} <= known
    assert "AEGIS_BATCH_SIZE" not in known
    assert namespace["PREFIXES"] == ("AEGIS_JOB_", "AEGIS_TEST_")
    assert namespace["DEPRECATED"] == {
        "AEGIS_ALERT_STATE_TTL_SECONDS": {"AEGIS_ALERT_STATE_TTL_S": "every component"},
        "AEGIS_BATCH_SIZE": {"AEGIS_PUMP_BATCH_SIZE": "pump"},
    }


def test_one_name_with_two_meanings_is_refused() -> None:
    class OtherValve(AegisSettings):
        service: str = "other"
        shared_gap_s: float = Field(default=5.0, gt=0, description="Another gap, seconds.")

    with pytest.raises(ConfigRefError, match="AEGIS_SHARED_GAP_S means different things"):
        build(components(("pump", PumpSettings), ("other", OtherValve)))


def test_a_setting_without_a_description_is_refused() -> None:
    class Bare(AegisSettings):
        service: str = "bare"
        bare_limit: int = 3

    with pytest.raises(ConfigRefError, match=r"Bare\.bare_limit has no description"):
        build(components(("bare", Bare)))


def test_the_new_name_comes_first_in_the_aliases() -> None:
    class Backwards(AegisSettings):
        service: str = "backwards"
        backwards_ack_wait_s: float = Field(
            default=1.0,
            validation_alias=AliasChoices("AEGIS_ACK_WAIT_S", "AEGIS_BACKWARDS_ACK_WAIT_S"),
            description="Seconds.",
        )

    with pytest.raises(ConfigRefError, match="AliasChoices\\('AEGIS_BACKWARDS_ACK_WAIT_S'"):
        build(components(("backwards", Backwards)))


def test_a_components_settings_are_the_most_derived_class_its_module_uses() -> None:
    module = types.ModuleType("made_up")
    module.AegisSettings = AegisSettings  # type: ignore[attr-defined]
    module.PumpSettings = PumpSettings  # type: ignore[attr-defined]
    assert settings_class_of(module) is PumpSettings
    module.ValveSettings = ValveSettings  # type: ignore[attr-defined]
    with pytest.raises(ConfigRefError, match="exactly one"):
        settings_class_of(module)
