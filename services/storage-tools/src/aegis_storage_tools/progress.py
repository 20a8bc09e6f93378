"""The progress display of the storage tools: a rich bar with count, rate (objects/s) and ETA on
stderr when it is a terminal; nothing otherwise (logs and the JSON summary say the rest)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class Tracker(Protocol):
    def stage(self, name: str, total: int | None) -> None: ...
    def advance(self, n: int = 1) -> None: ...


class _RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.0f}/s", style="progress.data.speed")


class _Bar:
    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: TaskID | None = None

    def stage(self, name: str, total: int | None) -> None:
        if self.task is not None:
            self.progress.stop_task(self.task)
        self.task = self.progress.add_task(name, total=total)

    def advance(self, n: int = 1) -> None:
        if self.task is not None:
            self.progress.advance(self.task, n)


class Quiet:
    def stage(self, name: str, total: int | None) -> None:
        return None

    def advance(self, n: int = 1) -> None:
        return None


@contextmanager
def progress_bar(enabled: bool | None = None) -> Iterator[Tracker]:
    """A bar per stage (plan, copy, verify, delete; or replay); ``enabled`` defaults to whether
    stderr is a terminal."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield Quiet()
        return
    columns = (
        TextColumn("{task.description:<8}"),
        BarColumn(),
        MofNCompleteColumn(),
        _RateColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as progress:
        yield _Bar(progress)
