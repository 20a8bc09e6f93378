"""structlog set-up shared by every AEGIS process, and the per-message context helper.

``configure`` sends structlog events and stdlib records (botocore, nats, faststream, uvicorn) through
one processor chain to one handler: JSON lines when the output is not a terminal, console otherwise.
Secrets are redacted from every line just before it is rendered (:mod:`aegis_runtime.redact`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from aegis_runtime.redact import redact_secrets

LogFormat = Literal["auto", "json", "console"]


class _AegisHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The one handler ``configure`` owns on the root logger (recognised by type, so never doubled).

    Without a fixed stream it writes to whatever ``sys.stdout`` (or ``sys.stderr``) is at emit
    time, so a handler set up before pytest swaps them for capture still writes where the test can
    read it.
    """

    def __init__(self, stream: TextIO | None, *, stderr: bool = False) -> None:
        self._stderr = stderr
        super().__init__(stream if stream is not None else self._current())
        self._fixed = stream is not None

    def _current(self) -> TextIO:
        return sys.stderr if self._stderr else sys.stdout

    def emit(self, record: logging.LogRecord) -> None:
        if not self._fixed:
            self.stream = self._current()
        super().emit(record)


def _drop_color_message(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    # uvicorn passes a coloured copy of each message as an ``extra``; it is noise in both renderers.
    event_dict.pop("color_message", None)
    return event_dict


def configure(
    format: LogFormat | str = "auto",
    level: str = "INFO",
    *,
    stream: TextIO | None = None,
    stderr: bool = False,
) -> None:
    """Set up structlog and the stdlib root logger; calling it again replaces the previous set-up.

    ``format``: ``json``, ``console`` or ``auto`` (console on a terminal, JSON otherwise).
    ``stream``: where lines go (default: ``sys.stdout`` at the time of each write, or
    ``sys.stderr`` with ``stderr=True``: a command whose stdout is its result, e.g. JSON).
    """
    if format not in ("auto", "json", "console"):
        raise ValueError(f"log format must be auto, json or console, not {format!r}")
    level_no = logging.getLevelNamesMapping().get(level.upper())
    if level_no is None:
        raise ValueError(f"unknown log level {level!r}")
    out = stream if stream is not None else (sys.stderr if stderr else sys.stdout)
    use_json = format == "json" or (format == "auto" and not _isatty(out))

    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Processor
    if use_json:
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=_isatty(out))
    # exceptions become text first so that the URLs and tokens in their messages are redacted too
    final: list[Processor] = [structlog.processors.format_exc_info, redact_secrets, renderer]

    structlog.configure(
        processors=[
            # drop below-level events before any work (merging the context copies it whole)
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # False: a logger used before configure() (an import-time log) must not keep the old set-up.
        cache_logger_on_first_use=False,
    )

    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder(), _drop_color_message],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *final],
    )
    handler = _AegisHandler(stream, stderr=stderr)
    handler.setFormatter(formatter)

    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _AegisHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level_no)


def _isatty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


@contextmanager
def bind_message(**values: Any) -> Iterator[None]:
    """Bind context (``service``, ``factory_id``, ``message_id``, ...) to every log line in the block.

    ``None`` values are skipped. On exit the context is restored exactly as it was, including keys a
    handler added inside with ``structlog.contextvars.bind_contextvars`` (they belong to the message).
    """
    saved = structlog.contextvars.get_contextvars()
    structlog.contextvars.bind_contextvars(**{k: v for k, v in values.items() if v is not None})
    try:
        yield
    finally:
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(**saved)
