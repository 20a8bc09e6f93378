"""``clock_moved``: a process started with its environment reads a wall clock that many seconds
ahead of this one's, whatever offset this one already runs on (``make test-at``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from aegis_devstack.testing.builders import clock_moved


def wall_clock_of_a_process(env: dict[str, str]) -> float:
    done = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout)


def test_a_process_started_with_the_clock_moved_an_hour_reads_an_hour_ahead() -> None:
    before = time.time()
    seen = wall_clock_of_a_process(clock_moved(os.environ, 3600))
    after = time.time()
    assert before + 3600 - 1 <= seen <= after + 3600 + 1


def test_the_same_process_without_it_reads_this_ones_clock() -> None:
    before = time.time()
    seen = wall_clock_of_a_process(dict(os.environ))
    after = time.time()
    assert before - 1 <= seen <= after + 1
