"""A test run leaves nothing behind: no server on the platform's default ports, no temporary
files or folders.

``make test`` gives the run a temporary directory of its own (``TMPDIR``, under the checkout), so
what a test, a fixture or a server it started forgets to remove is found there at the end, not
mixed with the machine's ``/tmp``; every child process inherits it, so a server's scratch folder
counts too. At the end of the session (after the session fixtures stopped their servers):

* anything left in that directory fails the run, named;
* a listener on a default port (MQTT 1883, NATS 4222 and its monitor 8222, the emulator 4566,
  the dashboard 8080, a health port 8081) that was not there when the run started fails it too.

Runs that use the system temporary directory (an ad-hoc ``pytest`` in a shared ``/tmp``) check
the ports only: other programs write there too. ``AEGIS_TEST_HYGIENE=off`` turns both off;
``AEGIS_TEST_HYGIENE_PORTS`` (comma-separated) watches other ports than the default ones (the
plugin's own tests watch a free port, never a default one). In a distributed run (pytest-xdist)
the controller checks, once, after every worker has ended.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from aegis_devstack.localservers import port_open

DEFAULT_PORTS = (1883, 4222, 4566, 8080, 8081, 8222)
SYSTEM_TEMP = {Path("/tmp"), Path("/var/tmp")}  # noqa: S108 - the folders to tell apart
_START = pytest.StashKey[tuple[set[str], set[int]]]()


def _enabled() -> bool:
    return os.environ.get("AEGIS_TEST_HYGIENE", "on").lower() not in {"off", "0", "false", "no"}


def _own_temp() -> Path | None:
    """The run's own temporary directory, or None when it is the machine's shared one."""
    folder = Path(tempfile.gettempdir()).resolve()
    return None if folder in {p.resolve() for p in SYSTEM_TEMP if p.exists()} else folder


def _watched() -> tuple[int, ...]:
    given = os.environ.get("AEGIS_TEST_HYGIENE_PORTS", "")
    return tuple(int(p) for p in given.split(",") if p.strip()) or DEFAULT_PORTS


def _listening() -> set[int]:
    return {port for port in _watched() if port_open("127.0.0.1", port)}


def leftovers(folder: Path, before: set[str]) -> list[str]:
    """What appeared in ``folder`` since ``before`` (one level, with a count for folders)."""
    found = []
    for entry in sorted(folder.iterdir()):
        if entry.name in before:
            continue
        if entry.is_dir():
            count = sum(1 for _ in entry.rglob("*"))
            found.append(f"{entry} ({count} entries inside)")
        else:
            found.append(str(entry))
    return found


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _enabled():
        return
    own = _own_temp()
    before = {entry.name for entry in own.iterdir()} if own else set()
    session.stash[_START] = (before, _listening())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _enabled() or _START not in session.stash:
        return
    if getattr(session.config, "workerinput", None) is not None:
        return  # a worker of a distributed run: the controller checks
    before, ports_before = session.stash[_START]
    problems = []
    own = _own_temp()
    if own is not None:
        problems += [
            f"left in the temporary directory: {entry}" for entry in leftovers(own, before)
        ]
    problems += [
        f"a server still listens on 127.0.0.1:{port}, a watched port"
        for port in sorted(_listening() - ports_before)
    ]
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = "the test run left things behind:\n  " + "\n  ".join(problems)
        if reporter is not None:
            reporter.write_line(text, red=True)
        else:  # pragma: no cover - pytest always has one outside -p no:terminal
            print(text)
        if exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
