"""CPU and memory of a process from its own accounting in /proc (Linux)."""

from __future__ import annotations

import os
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcSample:
    cpu_s: float
    rss_mb: float
    peak_rss_mb: float


def sample(pid: int) -> ProcSample:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[11], fields[12] are utime, stime (the 14th/15th of the full line)
    cpu = (int(fields[11]) + int(fields[12])) / _TICK
    rss = peak = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    return ProcSample(cpu, rss, peak)


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (every core, every process), from /proc/stat:
    how busy it was over an interval is the difference over the interval's seconds."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is counted in user already)
    return (sum(fields[:8]) - fields[3] - fields[4]) / _TICK
