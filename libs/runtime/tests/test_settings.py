"""The settings every process reads (aegis_runtime.settings.AegisSettings)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from aegis_runtime.settings import AegisSettings


def test_the_storage_clients_make_the_attempts_the_settings_give(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert AegisSettings().aws().max_attempts == 5
    monkeypatch.setenv("AEGIS_AWS_MAX_ATTEMPTS", "2")
    assert AegisSettings().aws().max_attempts == 2
    monkeypatch.setenv("AEGIS_AWS_MAX_ATTEMPTS", "0")  # at least the first attempt
    with pytest.raises(ValidationError, match="aws_max_attempts"):
        AegisSettings()
