"""Every Python process of ``make test-at`` starts here (the target puts this folder on
PYTHONPATH): its wall clock is moved ``TEST_CLOCK_OFFSET_S`` seconds and keeps ticking
(time-machine: ``time.time``, ``datetime.now``, ``date.today`` and the rest of the calendar
clock). The monotonic clock is left alone, so sleeps, timeouts and locks wait as long as they
should. The offset is the same number in every process, so pytest, the emulator and the
services it starts agree on the time. Without the variable nothing changes. (Not an AEGIS_*
name: tests start services with the AEGIS_* variables of their own choosing only.)"""

from __future__ import annotations

import os
import time

_OFFSET = os.environ.get("TEST_CLOCK_OFFSET_S")

if _OFFSET:
    import time_machine

    time_machine.travel(time.time() + float(_OFFSET), tick=True).start()
