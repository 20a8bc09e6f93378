"""The run-hygiene plugin fails a run that leaves files in its temporary directory, and passes
one that cleans up (an inner pytest run, with a temporary directory of its own)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

LEAKY = """
import tempfile

def test_forgets_its_folder():
    tempfile.mkdtemp(prefix="forgotten-")
"""
TIDY = """
import tempfile

def test_removes_its_folder():
    with tempfile.TemporaryDirectory(prefix="removed-"):
        pass
"""


def _run(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    project = tmp_path / "project"
    temp = tmp_path / "temp"
    project.mkdir()
    temp.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_it.py").write_text(body)
    inner = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "-p", "aegis_devstack.testing.hygiene",
            "-c", str(project / "pytest.ini"), "--rootdir", str(project),
            "--basetemp", str(tmp_path / "basetemp"), str(project / "test_it.py"),
        ],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "TMPDIR": str(temp), "AEGIS_TEST_HYGIENE": "on"},
    )  # fmt: skip
    return inner, temp


def test_a_run_that_leaves_a_folder_fails_and_names_it(tmp_path: Path) -> None:
    inner, temp = _run(tmp_path, LEAKY)
    assert inner.returncode == pytest.ExitCode.TESTS_FAILED, inner.stdout + inner.stderr
    assert "1 passed" in inner.stdout  # the test itself passed: the leak failed the run
    assert "left in the temporary directory" in inner.stdout
    (leaked,) = temp.iterdir()
    assert leaked.name.startswith("forgotten-") and leaked.name in inner.stdout


def test_a_run_that_cleans_up_passes(tmp_path: Path) -> None:
    inner, temp = _run(tmp_path, TIDY)
    assert inner.returncode == pytest.ExitCode.OK, inner.stdout + inner.stderr
    assert not list(temp.iterdir())
