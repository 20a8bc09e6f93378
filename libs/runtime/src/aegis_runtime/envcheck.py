"""At start, the ``AEGIS_*`` variables no AEGIS component reads, and deprecated names in use.

A setting that nobody reads is usually a misspelling, and pydantic-settings ignores it silently
(:class:`~aegis_runtime.settings.AegisSettings` must: deployments share one settings file between
services). An image holds its own service's settings class only, so a name counts as unknown only
when no component at all reads it: the names are those of :mod:`aegis_runtime.settings_names`,
which ``python -m aegis_devstack.configref`` writes from every component's settings.

Every service calls :func:`report_environment` as it starts (``run_service``; the dashboard in its
``main``), and so does the ``aegis`` command before a subcommand runs (its logs go to stderr): one
``unknown_settings`` warning with the unknown names and, for each, the closest known name when
there is a near match, and a ``deprecated_setting`` warning per deprecated name set, with its
replacement. Only names are logged, never values. Nothing fails: a process with unknown variables
starts as before.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from aegis_runtime.settings_names import DEPRECATED, KNOWN, PREFIXES

PREFIX = "AEGIS_"
# how alike (difflib's ratio, on the names without AEGIS_) a known name must be to be suggested
CLOSE_ENOUGH = 0.75


@dataclass(frozen=True, slots=True)
class EnvironmentReport:
    # unknown name as set -> the closest known name, or None when none is near
    unknown: dict[str, str | None]
    # deprecated name as set -> {its replacement: who reads it}
    deprecated: dict[str, dict[str, str]]
    # deprecated names set together with every replacement (the old value is not used)
    overridden: frozenset[str] = frozenset()


def closest(name: str, known: frozenset[str] = KNOWN) -> str | None:
    """The known name ``name`` most likely misspells, or None."""
    bare = {k.removeprefix(PREFIX): k for k in known}
    match = difflib.get_close_matches(name.removeprefix(PREFIX), bare, n=1, cutoff=CLOSE_ENOUGH)
    return bare[match[0]] if match else None


def check_environment(environ: Mapping[str, str]) -> EnvironmentReport:
    """The unknown and deprecated ``AEGIS_*`` names of ``environ`` (a pure function)."""
    # pydantic-settings reads names case-insensitively: so does the check
    present = {name.upper() for name in environ}
    unknown: dict[str, str | None] = {}
    deprecated: dict[str, dict[str, str]] = {}
    overridden: set[str] = set()
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(PREFIX) or upper in KNOWN or upper.startswith(PREFIXES):
            continue
        if (replacements := DEPRECATED.get(upper)) is not None:
            deprecated[name] = dict(replacements)
            if all(new in present for new in replacements):
                overridden.add(name)
        else:
            unknown[name] = closest(upper)
    return EnvironmentReport(unknown, deprecated, frozenset(overridden))


def report_environment(
    environ: Mapping[str, str] | None = None, *, logger: Any = None
) -> EnvironmentReport:
    """Check ``environ`` (default: this process's) and log what is wrong with it as warnings."""
    report = check_environment(os.environ if environ is None else environ)
    log = logger if logger is not None else structlog.get_logger(__name__)
    if report.unknown:
        log.warning(
            "unknown_settings",
            names=list(report.unknown),
            closest={k: v for k, v in report.unknown.items() if v is not None},
            detail="no AEGIS component reads these variables: misspelt, or left from an older "
            "release? Every name is in docs/configuration-reference.md",
        )
    for name, replacements in report.deprecated.items():
        fields: dict[str, Any] = {"variable": name}
        if len(replacements) == 1:
            fields["replacement"] = next(iter(replacements))
        else:
            fields["replacements"] = replacements  # each component reads its own
        if name in report.overridden:
            fields["ignored"] = True  # the replacement is set too, and wins
        log.warning("deprecated_setting", **fields)
    return report
