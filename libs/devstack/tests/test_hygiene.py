"""The run-hygiene plugin fails a run that leaves files in its temporary directory or a server
on a watched port, and passes one that cleans up: each an inner pytest run, with a temporary
directory of its own, also distributed over workers as ``make test`` runs (pytest-xdist). The
inner runs watch a free port of the test's, never a default one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from aegis_devstack.localservers import free_port

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


LISTENS = """
import os
import socket

KEPT = []

def test_leaves_a_server_listening():
    server = socket.socket()
    server.bind(("127.0.0.1", int(os.environ["WATCHED_PORT"])))
    server.listen()
    KEPT.append(server)  # still open when the session ends
"""
LEAKY_ON_WORKERS = """
import tempfile

def test_one():
    tempfile.mkdtemp(prefix="forgotten-one-")

def test_two():
    tempfile.mkdtemp(prefix="forgotten-two-")
"""


def _run(
    tmp_path: Path, body: str, *options: str, port: int | None = None
) -> tuple[subprocess.CompletedProcess[str], Path]:
    project = tmp_path / "project"
    temp = tmp_path / "temp"
    project.mkdir()
    temp.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_it.py").write_text(body)
    watched = port or free_port()
    inner = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "-p", "aegis_devstack.testing.hygiene", *(("-p", "xdist") if "-n" in options else ()),
            *options,
            "-c", str(project / "pytest.ini"), "--rootdir", str(project),
            "--basetemp", str(tmp_path / "basetemp"), str(project / "test_it.py"),
        ],
        capture_output=True, text=True, timeout=120, check=False,
        env={
            **os.environ, "TMPDIR": str(temp), "AEGIS_TEST_HYGIENE": "on",
            # only the plugins named above: the inner run starts in a fraction of the time
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "AEGIS_TEST_HYGIENE_PORTS": str(watched), "WATCHED_PORT": str(watched),
        },
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


def test_a_run_that_leaves_a_server_on_a_watched_port_fails_and_names_the_port(
    tmp_path: Path,
) -> None:
    port = free_port()
    inner, _ = _run(tmp_path, LISTENS, port=port)
    assert inner.returncode == pytest.ExitCode.TESTS_FAILED, inner.stdout + inner.stderr
    assert "1 passed" in inner.stdout
    assert f"a server still listens on 127.0.0.1:{port}" in inner.stdout


def test_a_server_already_listening_when_the_run_starts_is_not_blamed(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as before:
        before.bind(("127.0.0.1", port))
        before.listen()
        inner, _ = _run(tmp_path, TIDY, port=port)
    assert inner.returncode == pytest.ExitCode.OK, inner.stdout + inner.stderr
    assert "still listens" not in inner.stdout


def test_a_distributed_run_reports_every_workers_leftovers_once_and_fails(
    tmp_path: Path,
) -> None:
    inner, temp = _run(tmp_path, LEAKY_ON_WORKERS, "-n", "2")
    assert inner.returncode == pytest.ExitCode.TESTS_FAILED, inner.stdout + inner.stderr
    assert "2 passed" in inner.stdout
    leaked = sorted(entry.name for entry in temp.iterdir())
    assert [name.split("-")[1] for name in leaked] == ["one", "two"]
    for name in leaked:  # named once: by the controller, not again by a worker
        assert inner.stdout.count(name) == 1, inner.stdout
    assert inner.stdout.count("the test run left things behind") == 1
