"""``deploy/infra/render.py`` (the template's renderer, not a package) as a module for tests."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any


def load_render(infra: Path) -> ModuleType:
    """The renderer in ``infra`` (the repository's ``deploy/infra``), imported from its file."""
    spec = importlib.util.spec_from_file_location("aegis_infra_render", infra / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def resolve(
    render: ModuleType, value: Any, parameters: Mapping[str, Any], conditions: Mapping[str, bool]
) -> Any:
    """``value`` from the rendered template with the intrinsic functions it uses (``Ref``,
    ``Fn::GetAtt``, ``Fn::Sub``, ``Fn::If``) resolved as CloudFormation would for these
    parameters and conditions (``render``: the module :func:`load_render` gives). An attribute
    is the parameter ``{Logical}.{Attribute}`` (``SealRawSchedulerRole.Arn``); a list parameter
    (a CommaDelimitedList) is what a Ref to it gives, and no string of a Fn::Sub."""
    if isinstance(value, dict) and len(value) == 1:
        [(fn, arg)] = value.items()
        if fn in ("Ref", "Fn::GetAtt"):
            return parameters[arg if fn == "Ref" else ".".join(arg)]
        if fn == "Fn::Sub":
            strings = {k: v for k, v in parameters.items() if isinstance(v, str)}
            return render.substitute(arg, strings)
        if fn == "Fn::If":
            chosen = arg[1] if conditions[arg[0]] else arg[2]
            return resolve(render, chosen, parameters, conditions)
    if isinstance(value, dict):
        return {k: resolve(render, v, parameters, conditions) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(render, v, parameters, conditions) for v in value]
    return value


def cfn_lifecycle_rule(rule: Mapping[str, Any]) -> dict[str, Any]:
    """A template's lifecycle rule (CloudFormation's spelling) in the S3 API's, as
    ``aegis_storage.bootstrap.normalize_rules`` takes it."""
    api: dict[str, Any] = {
        "ID": rule["Id"],
        "Status": rule["Status"],
        "Filter": {"Prefix": rule.get("Prefix", "")},
    }
    if "Transitions" in rule:
        api["Transitions"] = [
            {"Days": t["TransitionInDays"], "StorageClass": t["StorageClass"]}
            for t in rule["Transitions"]
        ]
    if "ExpirationInDays" in rule:
        api["Expiration"] = {"Days": rule["ExpirationInDays"]}
    if "NoncurrentVersionExpiration" in rule:
        api["NoncurrentVersionExpiration"] = rule["NoncurrentVersionExpiration"]
    if "AbortIncompleteMultipartUpload" in rule:
        api["AbortIncompleteMultipartUpload"] = rule["AbortIncompleteMultipartUpload"]
    return api
