"""A progress bar for long commands (``aegis report --from/--to``): rich, on stderr, shown when
stderr is a terminal (or when asked). stdout keeps only the results: when stdout is the same
terminal, lines printed meanwhile go above the bar; when it is a pipe or a file, they go there,
untouched."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Bar(Protocol):
    def advance(self, n: int = 1) -> None: ...
    def describe(self, text: str) -> None: ...


class _Quiet:
    def advance(self, n: int = 1) -> None:
        return None

    def describe(self, text: str) -> None:
        return None


@contextmanager
def progress_bar(total: int | None, description: str, enabled: bool | None = None) -> Iterator[Bar]:
    """One bar of ``total`` steps; ``enabled`` defaults to whether stderr is a terminal."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield _Quiet()
        return
    from rich.console import Console  # noqa: PLC0415 - only when a bar is shown
    from rich.progress import (  # noqa: PLC0415
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        redirect_stdout=sys.stdout.isatty(),  # a pipe's results are never rerouted
        redirect_stderr=False,
    )
    with progress:
        task = progress.add_task(description, total=total)

        class _Rich:
            def advance(self, n: int = 1) -> None:
                progress.advance(task, n)

            def describe(self, text: str) -> None:
                progress.update(task, description=text)

        yield _Rich()
