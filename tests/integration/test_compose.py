"""Static checks of the local stack: compose.yaml, its Dockerfile and deploy/aegis.env.

No Docker engine is needed: the files are read and cross-checked against the compose-spec
schema (vendored by check-jsonschema), the workspace's members and the `aegis` CLI.
"""

from __future__ import annotations

import importlib
import importlib.resources
import json
import os
import re
import shlex
import tomllib
from collections.abc import Mapping
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import jsonschema  # type: ignore[import-untyped]  # no types-jsonschema in the venv
import pytest
import typer
import yaml

from aegis_runtime.settings import AegisSettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose.yaml"
AEGIS_ENV_FILE = ROOT / "deploy" / "aegis.env"

# The endpoints every AEGIS container needs, and the compose service each one must point at.
ENDPOINT_SERVICES = {
    "AEGIS_AWS_ENDPOINT_URL": "localstack",
    "AEGIS_MQTT_URL": "mosquitto",
    "AEGIS_NATS_URL": "nats",
}
WAIT_CONDITIONS = {"service_healthy", "service_completed_successfully"}
LOCALSTACK_FREE_TAG = "localstack/localstack:4.14.0"


def load_compose() -> dict[str, Any]:
    # safe_load resolves the `<<: *aegis` merge keys, as compose does.
    data = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(data, dict), "compose.yaml is not a mapping"
    return cast("dict[str, Any]", data)


def services() -> dict[str, dict[str, Any]]:
    found = load_compose().get("services")
    assert isinstance(found, dict) and found, "compose.yaml defines no services"
    return cast("dict[str, dict[str, Any]]", found)


def compose_schema() -> dict[str, Any]:
    resource = importlib.resources.files("check_jsonschema.builtin_schemas.vendor").joinpath(
        "compose-spec.json"
    )
    return cast("dict[str, Any]", json.loads(resource.read_text(encoding="utf-8")))


def parse_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines; blank lines and `#` comments allowed, nothing else."""
    values: dict[str, str] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}:{number}: not a KEY=VALUE line: {raw!r}"
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", key), f"{path.name}:{number}: bad key {key!r}"
        assert key not in values, f"{path.name}:{number}: {key} set twice"
        assert value == value.strip(), f"{path.name}:{number}: {key} has surrounding spaces"
        assert value[:1] not in {"'", '"'}, f"{path.name}:{number}: {key} is quoted"
        values[key] = value
    return values


def env_files(service: dict[str, Any]) -> list[Path]:
    entries = service.get("env_file", [])
    if isinstance(entries, str | dict):
        entries = [entries]
    return [ROOT / (entry if isinstance(entry, str) else entry["path"]) for entry in entries]


def workspace_members() -> dict[str, Path]:
    members: dict[str, Path] = {}
    for manifest in sorted(
        [*ROOT.glob("libs/*/pyproject.toml"), *ROOT.glob("services/*/pyproject.toml")]
    ):
        name = tomllib.loads(manifest.read_text(encoding="utf-8"))["project"]["name"]
        members[name] = manifest.parent
    return members


def build_args(build: dict[str, Any]) -> dict[str, str]:
    args = build.get("args", {})
    if isinstance(args, list):
        pairs = [str(item).partition("=") for item in args]
        return {key: value for key, _, value in pairs}
    return {str(key): str(value) for key, value in args.items()}


def builds() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for name, service in services().items():
        build = service.get("build")
        if build is not None:
            found[name] = {"context": build} if isinstance(build, str) else build
    return found


def schema_errors(document: dict[str, Any]) -> list[str]:
    schema = compose_schema()
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    validator = validator_class(schema, format_checker=validator_class.FORMAT_CHECKER)
    errors = sorted(validator.iter_errors(document), key=lambda error: list(error.path))
    return [f"{'/'.join(map(str, error.path)) or '<root>'}: {error.message}" for error in errors]


def test_compose_file_matches_the_compose_spec() -> None:
    errors = schema_errors(load_compose())
    assert not errors, "\n".join(errors)


def test_service_templates_are_valid_services() -> None:
    # x-* anchors are opaque to the schema; check them as the services they will become.
    compose = load_compose()
    defined = services()
    templates = {
        key: value for key, value in compose.items() if key in {"x-aegis", "x-aegis-service"}
    }
    assert templates.keys() == {"x-aegis", "x-aegis-service"}
    errors = schema_errors({"services": templates})
    assert not errors, "\n".join(errors)
    assert templates["x-aegis-service"].get("healthcheck"), "long-running services need one"
    for key, template in templates.items():
        for target, options in template.get("depends_on", {}).items():
            assert target in defined, f"{key} depends on {target}, which is not a service"
            assert options.get("condition") in WAIT_CONDITIONS, f"{key} -> {target}"


def test_every_service_is_health_checked_or_a_one_shot() -> None:
    for name, service in services().items():
        healthcheck = service.get("healthcheck") or {}
        checked = bool(healthcheck.get("test")) and not healthcheck.get("disable", False)
        if checked:
            assert healthcheck["test"] != ["NONE"], f"{name}: healthcheck test is NONE"
        one_shot = service.get("restart") == "no"
        assert checked or one_shot, f"{name}: needs a healthcheck, or restart 'no' as a one-shot"


def test_dependencies_name_services_and_wait_for_them() -> None:
    defined = services()
    graph: dict[str, set[str]] = {}
    for name, service in defined.items():
        depends_on = service.get("depends_on", {})
        assert isinstance(depends_on, dict), (
            f"{name}: depends_on must be the long form with a condition"
        )
        for target, options in depends_on.items():
            assert target in defined, f"{name} depends on {target}, which is not a service"
            condition = (options or {}).get("condition")
            assert condition in WAIT_CONDITIONS, (
                f"{name} -> {target}: condition must be one of {sorted(WAIT_CONDITIONS)}"
            )
            if condition == "service_healthy":
                assert "healthcheck" in defined[target], f"{name} waits for {target}'s health"
            else:
                assert defined[target].get("restart") == "no", (
                    f"{name} waits for {target} to complete, but {target} is not a one-shot"
                )
        graph[name] = set(depends_on)
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as err:
        pytest.fail(f"depends_on has a cycle: {err.args[1]}")


def test_localstack_defaults_to_the_last_tag_without_an_auth_token() -> None:
    image = services()["localstack"]["image"]
    match = re.fullmatch(r"\$\{LOCALSTACK_IMAGE:-(?P<default>[^}]+)\}", image)
    assert match, f"localstack image should be ${{LOCALSTACK_IMAGE:-...}}, is {image!r}"
    assert match["default"] == LOCALSTACK_FREE_TAG


def test_builds_use_an_existing_dockerfile_and_a_workspace_member() -> None:
    members = workspace_members()
    assert builds(), "no service is built from the workspace"
    for name, build in builds().items():
        context = ROOT / build.get("context", ".")
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        assert dockerfile.is_file(), f"{name}: no Dockerfile at {dockerfile}"
        text = dockerfile.read_text(encoding="utf-8")
        declared = set(re.findall(r"^ARG\s+(\w+)", text, flags=re.MULTILINE))
        args = build_args(build)
        for arg in args:
            assert arg in declared, f"{name}: build arg {arg} is not an ARG of {dockerfile.name}"
        package = args.get("PACKAGE")
        assert package, f"{name}: build arg PACKAGE names the member to install"
        assert package in members, (
            f"{name}: PACKAGE={package} is not a workspace member ({sorted(members)})"
        )


def command_words(service: dict[str, Any]) -> list[str]:
    command = service.get("command")
    if command is None:
        return []
    return shlex.split(command) if isinstance(command, str) else [str(word) for word in command]


def subcommands(command: object) -> Mapping[str, object] | None:
    """A click-style group's subcommands by name; None for a leaf command.

    Duck-typed: recent typer versions vendor click, so `click.Group` is not their base class.
    """
    found = getattr(command, "commands", None)
    return cast("Mapping[str, object]", found) if isinstance(found, Mapping) else None


def test_aegis_commands_name_existing_subcommands() -> None:
    invocations = {
        name: words
        for name, service in services().items()
        if (words := command_words(service))[:1] == ["aegis"]
    }
    assert invocations, "no service runs the aegis CLI"
    # Imported by name: the CLI is another member's module; its absence fails this test only.
    app = importlib.import_module("aegis_runtime.cli").app
    assert isinstance(app, typer.Typer), "aegis_runtime.cli.app is not a typer.Typer"
    root = typer.main.get_command(app)
    assert subcommands(root) is not None, "the aegis CLI has no subcommands"
    for name, words in invocations.items():
        command: object = root
        path = ["aegis"]
        for word in words[1:]:
            children = subcommands(command)
            if word.startswith("-") or children is None:
                break
            assert word in children, (
                f"{name}: `{' '.join(path)}` has no subcommand {word!r} (has {sorted(children)})"
            )
            command = children[word]
            path.append(word)
        assert len(path) > 1, f"{name}: `{' '.join(words)}` names no aegis subcommand"


def test_aegis_env_points_every_endpoint_at_its_compose_service() -> None:
    defined = services()
    referenced = {path for service in defined.values() for path in env_files(service)}
    assert AEGIS_ENV_FILE in referenced, "no service loads deploy/aegis.env"
    for path in referenced:
        assert path.is_file(), f"env_file {path} does not exist"
    values = parse_env_file(AEGIS_ENV_FILE)
    for variable, service_name in ENDPOINT_SERVICES.items():
        assert values.get(variable), f"deploy/aegis.env does not set {variable}"
        host = urlsplit(values[variable]).hostname
        assert host == service_name, f"{variable} should point at {service_name}, not {host}"
        assert host in defined
    # Variables the compose definitions read inside containers (e.g. healthchecks' health port).
    # Parsed, not raw, so that comments do not count.
    compose = load_compose()
    text = json.dumps({key: value for key, value in compose.items() if key != "volumes"})
    used = set(re.findall(r"\bAEGIS_[A-Z0-9_]+\b", text))
    # ${AEGIS_...} is interpolated by compose from the caller's environment, not the container's.
    interpolated = set(re.findall(r"\$\{(AEGIS_[A-Z0-9_]+)", text))
    missing = sorted(used - interpolated - set(values))
    assert not missing, f"compose.yaml relies on {missing}, which deploy/aegis.env does not set"


def test_aegis_env_values_are_valid_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # Read as a service reads them, without the test runner's own AEGIS_* variables.
    for key in [key for key in os.environ if key.startswith("AEGIS_")]:
        monkeypatch.delenv(key)
    values = parse_env_file(AEGIS_ENV_FILE)
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    settings = AegisSettings()
    assert settings.aws_endpoint_url == values["AEGIS_AWS_ENDPOINT_URL"]
    assert settings.mqtt_url == values["AEGIS_MQTT_URL"]
    assert settings.nats_url == values["AEGIS_NATS_URL"]
