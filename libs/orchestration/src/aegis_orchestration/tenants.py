"""Tenants: the factories each tenant's jobs start for, as the orchestrator's tenants file
(``AEGIS_ORCHESTRATOR_TENANTS_FILE``) declares them, and what a trigger asks of a tenant's job.

```yaml
tenants:
  aegis/plant-ops: [factory-a, "north-*"]   # {tenant_app_id}/{tenant_account_id}
  contractors: "factory-c,factory-d"         # a name, for jobs that say tenant: contractors
  aegis/audit: []                            # declared, with no factory (starts for none)
```

A scope is what people's scopes are (:func:`aegis_contracts.people.parse_scope`): factory ids and
shell-style patterns, ``*`` the whole fleet. A job with a ``tenant`` starts from an event only
when the event's factory is in its tenant's scope; from an event that belongs to no factory (a
cloud check, a sign-in) only when the job says ``unscoped_events: true``; a cron fire is the
job's own and always starts it. A job whose tenant the file does not declare is refused when it
is registered, and never started. Jobs without a tenant are not concerned.

Errors: :class:`TenantsFileError` (a ``ValueError``) naming the file and what is wrong.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from aegis_contracts.people import covers, parse_scope
from aegis_orchestration.model import TENANT_PATTERN, Job

_TENANT = re.compile(TENANT_PATTERN)
FILE_VARIABLE = "AEGIS_ORCHESTRATOR_TENANTS_FILE"
# the setting's meaning, one text for every component that reads the file (the orchestrator and
# `aegis jobs`, the dashboard's jobs API)
FILE_DESCRIPTION = (
    "The tenants and the factories each one's jobs start for, a YAML file: `tenants:` mapping "
    "each tenant (`{tenant_app_id}/{tenant_account_id}` of imported tables, or a name) to factory "
    'ids and patterns (`[factory-a, "north-*"]`; `*`: every factory). A job with a `tenant` '
    "starts only for events of its tenant's factories; one whose tenant is not declared is "
    "refused by `aegis jobs register` and `import` and the dashboard's jobs API, and never "
    "started. The orchestrator reads it at start and at every refresh. Unset: no tenant is "
    "declared (jobs without a tenant are not concerned)."
)

# why a trigger left a tenant's job alone (:attr:`aegis_orchestration.triggers.Evaluation.skipped`)
TENANT_UNDECLARED = "tenant_undeclared"
OTHER_FACTORY = "factory_out_of_scope"
NO_FACTORY = "no_factory"


class TenantsFileError(ValueError):
    """The tenants file cannot be read or is not what it should be."""


@dataclass(frozen=True, slots=True)
class Tenants:
    """The declared tenants, each with its scope; ``source`` names where they were declared."""

    scopes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    source: str | None = None

    def scope(self, tenant: str) -> tuple[str, ...] | None:
        return self.scopes.get(tenant)

    def refusal(self, job: Job) -> str | None:
        """Why ``job`` cannot be registered here: its tenant is not declared (None: it can)."""
        if job.tenant is None or job.tenant in self.scopes:
            return None
        whose = f"job {job.id} belongs to tenant {job.tenant!r}"
        if self.source:
            return f"{whose}, which the tenants file {self.source} does not declare"
        return f"{whose}, and no tenants file declares it ({FILE_VARIABLE} is not set)"

    def skip(self, job: Job, factory: str | None, *, own: bool = False) -> str | None:
        """Why an event of ``factory`` (None: of no factory; ``own``: the job's own cron fire)
        does not start ``job``, one of :data:`TENANT_UNDECLARED`, :data:`NO_FACTORY`,
        :data:`OTHER_FACTORY`; None when the tenant lets it start."""
        if job.tenant is None:
            return None
        scope = self.scopes.get(job.tenant)
        if scope is None:
            return TENANT_UNDECLARED
        if own:
            return None
        if factory is None:
            return None if job.unscoped_events else NO_FACTORY
        return None if covers(scope, factory) else OTHER_FACTORY


def parse_tenants(text: str, *, source: str | None = None) -> Tenants:
    """The tenants of the file's YAML text (``source``: the file's path, named in errors and
    refusals); :class:`TenantsFileError` naming what is wrong."""
    where = f"the tenants file {source}" if source else "the tenants file"
    try:
        doc = yaml.load(text, Loader=_UniqueKeys)  # noqa: S506 - a SafeLoader
    except _GivenTwice as err:
        raise TenantsFileError(f"{where}: {err}") from None
    except yaml.YAMLError as err:
        raise TenantsFileError(f"{where} is not YAML: {err}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict) or set(doc) - {"tenants"}:
        raise TenantsFileError(f"{where}: expected a mapping with one key, 'tenants'")
    entries = doc.get("tenants") or {}
    if not isinstance(entries, dict):
        raise TenantsFileError(f"{where}: 'tenants' is a mapping of tenant to factories")
    scopes: dict[str, tuple[str, ...]] = {}
    problems: list[str] = []
    for tenant, factories in entries.items():
        name = str(tenant)
        if not _TENANT.fullmatch(name):
            problems.append(
                f"{name!r} is no tenant ('{{app_id}}/{{account_id}}' or a name, no spaces)"
            )
            continue
        try:
            scopes[name] = _scope(factories)
        except ValueError as err:
            problems.append(f"{name}: {err}")
    if problems:
        raise TenantsFileError(f"{where}: " + "; ".join(problems))
    return Tenants(scopes, source)


def _scope(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return parse_scope(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return parse_scope(value)
    raise ValueError("a list of factory ids or patterns ([] for none)")


def load_tenants(path: Path | None) -> Tenants:
    """The tenants of the file at ``path``; none declared when ``path`` is None."""
    if path is None:
        return Tenants()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise TenantsFileError(f"the tenants file {path} cannot be read: {err}") from None
    return parse_tenants(text, source=str(path))


class _GivenTwice(ValueError):
    pass


class _UniqueKeys(yaml.SafeLoader):
    """A safe loader that refuses a key given twice (YAML would keep the last silently)."""


def _unique_mapping(loader: _UniqueKeys, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise _GivenTwice(f"{key!r} is given twice (line {key_node.start_mark.line + 1})")
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)
