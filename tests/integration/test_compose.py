"""Static checks of the local stack: compose.yaml, its Dockerfile and deploy/aegis.env.

No Docker engine is needed: the files are read and cross-checked against the compose-spec
schema (vendored by check-jsonschema), the workspace's members and the `aegis` CLI.
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.resources
import json
import os
import re
import shlex
from collections.abc import Mapping
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import jsonschema  # type: ignore[import-untyped]  # no types-jsonschema in the venv
import pytest
import typer
import yaml

from aegis_devstack.testing.workspace import Workspace
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
WORKSPACE = Workspace(ROOT)
# long-running services that start only with a profile (`docker compose --profile demo up`)
PROFILED = {"simulator": {"simulator", "demo"}}


def load_compose() -> dict[str, Any]:
    """compose.yaml, a copy of its own for each caller (some change it)."""
    return copy.deepcopy(_compose())


@functools.cache
def _compose() -> dict[str, Any]:
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
    members = WORKSPACE.members
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
        # the name k8s and ECS use too (deploy/k8s images:, deploy/ecs task definitions)
        assert services()[name].get("image") == f"{package}:local", f"{name}: image name"


def command_words(service: dict[str, Any]) -> list[str]:
    command = service.get("command")
    if command is None:
        return []
    return shlex.split(command) if isinstance(command, str) else [str(word) for word in command]


def subcommands(command: object) -> Mapping[str, object] | None:
    """A click-style group's subcommands by name; None for a leaf command.

    Duck-typed: recent typer versions vendor click, so `click.Group` is not their base class.
    The root lists its plugins' commands by name and loads each when asked (list_commands,
    get_command), so a group is read through those two, not its ``commands`` attribute.
    """
    if not isinstance(getattr(command, "commands", None), Mapping):
        return None
    group = cast("Any", command)
    ctx = typer.Context(group)
    return {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}


def test_aegis_commands_name_existing_subcommands() -> None:
    invocations = {
        name: words
        for name, service in services().items()
        if (words := command_words(service))[:1] == ["aegis"]
    }
    assert invocations, "no service runs the aegis CLI"
    # Imported by name: the CLI is another member's module; its absence fails this test only.
    app = importlib.import_module("aegis_cli.app").app
    assert isinstance(app, typer.Typer), "aegis_cli.app.app is not a typer.Typer"
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
    # Variables the compose definitions read inside containers (e.g. healthchecks' health port):
    # each service must get them from its env files or its own `environment:`. Parsed, not raw,
    # so that comments do not count.
    for name, service in defined.items():
        text = json.dumps(service)
        used = set(re.findall(r"\bAEGIS_[A-Z0-9_]+\b", text))
        # ${AEGIS_...} is interpolated by compose from the caller's environment, not the container's.
        interpolated = set(re.findall(r"\$\{(AEGIS_[A-Z0-9_]+)", text))
        provided = {key for path in env_files(service) for key in parse_env_file(path)}
        provided |= set(environment(service))
        missing = sorted(used - interpolated - provided)
        assert not missing, f"{name} relies on {missing}, which nothing sets in its container"


def environment(service: dict[str, Any]) -> dict[str, str]:
    entries = service.get("environment", {})
    if isinstance(entries, list):
        return dict(str(entry).partition("=")[::2] for entry in entries)
    return {str(key): str(value) for key, value in entries.items()}


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


def published(service: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(host ip, host port, container port) of the short-syntax `ports:` entries."""
    found = []
    for entry in service.get("ports", []):
        assert isinstance(entry, str), f"use the short syntax HOST_IP:HOST:CONTAINER, not {entry}"
        host_ip, host_port, container_port = entry.rsplit(":", 2)
        found.append((host_ip, int(host_port), int(container_port)))
    return found


def health_url_port(service: dict[str, Any]) -> int:
    """The container port the healthcheck asks /readyz of (a literal or a variable it is given)."""
    test = " ".join(map(str, service["healthcheck"]["test"]))
    assert "/readyz" in test, f"the healthcheck does not ask /readyz: {test}"
    match = re.search(r"127\.0\.0\.1:' \+ os\.environ\['(AEGIS_[A-Z_]+)'\]", test)
    assert match, f"the healthcheck does not read its port from a variable: {test}"
    env = {key: value for path in env_files(service) for key, value in parse_env_file(path).items()}
    env |= environment(service)
    return int(env[match[1]])


def test_every_deployable_of_the_workspace_runs_in_compose() -> None:
    defined = services()
    deployables = WORKSPACE.deployables
    assert {"ingest", "processor", "dashboard-api", "simulator"} <= set(deployables)
    for name, deployable in deployables.items():
        assert name in defined, f"{deployable.package} is a deployable without a compose service"
        service = defined[name]
        assert build_args(builds()[name]).get("PACKAGE") == deployable.package, name
        assert service["image"] == f"{deployable.package}:local", f"{name}: its own image"
        assert command_words(service) == [deployable.script], (
            f"{name} should run its console script {deployable.script}"
        )
        assert health_url_port(service) == deployable.health_port, name
        assert service.get("restart") == "unless-stopped", name
        assert set(service.get("profiles", [])) == PROFILED.get(name, set()), (
            f"{name}: profiles {service.get('profiles')}"
        )
        assert service.get("stop_grace_period"), f"{name}: graceful shutdown needs time"


def test_aegis_containers_run_locked_down() -> None:
    for name in builds():
        service = services()[name]
        assert service.get("read_only") is True, f"{name}: read-only root filesystem"
        assert "/tmp" in service.get("tmpfs", []), f"{name}: a writable /tmp"
        assert service.get("cap_drop") == ["ALL"], name
        assert "no-new-privileges:true" in service.get("security_opt", []), name


def test_ingest_keeps_one_mqtt_session_across_recreates() -> None:
    """Without a fixed client id each `docker compose up` after a change opens a new persistent
    session (the default id is the container's random hostname), and the broker keeps queueing
    for the old one until it expires."""
    ingest = services()["ingest"]
    client_id = ingest.get("environment", {}).get("AEGIS_MQTT_CLIENT_ID")
    assert client_id and client_id.startswith("aegis-ingest"), "set AEGIS_MQTT_CLIENT_ID"
    assert ingest.get("hostname"), "a stable hostname (logs, metrics) as well"
    assert "deploy" not in ingest or ingest["deploy"].get("replicas", 1) == 1, "one id, one replica"


def test_commands_exist_in_the_image_that_runs_them() -> None:
    # What the image installs is PACKAGE's closure of workspace members, so a console script or
    # an `aegis` subcommand of another member is absent from it even if the dev venv has it.
    for name, build in builds().items():
        package = build_args(build)["PACKAGE"]
        words = command_words(services()[name])
        assert words, f"{name}: set the command (the image's CMD is only `aegis --help`)"
        scripts = WORKSPACE.scripts(package)
        assert words[0] in scripts, f"{name}: {words[0]} is not a script of {package} ({scripts})"
        if words[0] == "aegis":
            commands = WORKSPACE.aegis_commands(package)
            assert words[1] in commands, f"{name}: no `aegis {words[1]}` in {package}'s image"


def test_only_the_dashboard_and_the_infrastructure_publish_ports_on_loopback() -> None:
    ports = {name: published(service) for name, service in services().items()}
    assert ports["dashboard-api"] == [("127.0.0.1", 8080, 8080)]
    for name, entries in ports.items():
        for host_ip, _, _ in entries:
            assert host_ip == "127.0.0.1", f"{name} publishes on {host_ip}: loopback only"
    backend = set(WORKSPACE.deployables) - {"dashboard-api"}
    assert not [name for name in backend if ports.get(name)], "services need no published port"


def test_the_orchestrator_reads_the_example_jobs_from_a_mount_of_deploy_jobs() -> None:
    service = services()["orchestrator"]
    jobs_file = environment(service)["AEGIS_ORCHESTRATOR_JOBS_FILE"]
    for volume in service.get("volumes", []):
        source, target, *mode = str(volume).split(":")
        if jobs_file.startswith(target.rstrip("/") + "/"):
            assert mode == ["ro"], "the jobs are read, never written"
            host_file = ROOT / source / jobs_file.removeprefix(target.rstrip("/") + "/")
            assert host_file.is_file(), f"{host_file} does not exist"
            jobs = yaml.safe_load(host_file.read_text(encoding="utf-8"))["jobs"]
            assert jobs, f"{host_file} holds no job"
            return
    pytest.fail(f"{jobs_file} is not inside any volume of the orchestrator")


def test_bad_compose_documents_are_refused_by_the_schema() -> None:
    # The schema check can fail: a misspelt key and a bad condition are both reported.
    # (through JSON: the YAML anchors make services share their mappings, which a deepcopy keeps)
    document = json.loads(json.dumps(load_compose()))
    document["services"]["ingest"]["restrat"] = "always"
    document["services"]["processor"]["depends_on"]["nats"]["condition"] = "started"
    errors = "\n".join(schema_errors(document))
    assert "services/ingest" in errors and "restrat" in errors
    assert "services/processor/depends_on: " in errors
    assert not [line for line in errors.splitlines() if "services/aggregator" in line]


BROKER_CONFIGS = [
    ROOT / "deploy" / "mosquitto" / "mosquitto.conf",
    ROOT / "deploy" / "mosquitto" / "mosquitto.prod.conf",
    ROOT / "deploy" / "k8s" / "overlays" / "local" / "mosquitto.conf",
]
BROKER_IMAGE_FILES = [
    COMPOSE_FILE,
    ROOT / "deploy" / "k8s" / "overlays" / "local" / "mosquitto.yaml",
]


@pytest.mark.parametrize("config", BROKER_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_broker_config_loads_the_sqlite_persistence_plugin_and_bounds_queued_bytes(
    config: Path,
) -> None:
    # Mosquitto's built-in persistence file restores plain subscriptions only: a scaled-out
    # ingest's $share subscription would be gone after a broker restart and what devices publish
    # before ingest reconnects dropped. Mosquitto 2.1's persist-sqlite plugin restores it. The
    # restart itself is not tried here: the Mosquitto of the machines this suite runs on (2.0)
    # has no such plugin, so this checks what each config asks the broker for.
    lines = [ln.split("#", 1)[0].split() for ln in config.read_text().splitlines()]
    options = {words[0]: words[1:] for words in lines if words}
    # a whole-broker plugin is a global_plugin where listeners have their own settings
    plugin = options.get("global_plugin") or options.get("plugin")
    assert plugin == ["/usr/lib/mosquitto_persist_sqlite.so"], config
    assert options.get("persistence_location") == ["/mosquitto/data/"], config
    # 2.1 refuses to start with both the plugin and the built-in file
    assert "persistence" not in options and "autosave_interval" not in options, config
    # what a session may hold while its client is away is bounded in bytes too (0: unbounded)
    assert 0 < int(options["max_queued_bytes"][0]) <= 4 * 1024**3, config


@pytest.mark.parametrize("file", BROKER_IMAGE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_brokers_run_a_mosquitto_that_has_the_persistence_plugin(file: Path) -> None:
    images = re.findall(r"image:\s*(eclipse-mosquitto:\S+)", file.read_text())
    assert images, file
    for image in images:
        version = tuple(int(n) for n in image.split(":")[1].split("-")[0].split(".")[:2])
        assert version >= (2, 1), f"{file}: {image} has no persist-sqlite plugin (2.1 and later)"


def test_the_daily_raw_seal_runs_in_compose_on_the_cronjobs_schedule() -> None:
    """What Kubernetes runs as the CronJob seal-raw and ECS as an EventBridge schedule, compose
    runs as a service of the storage-tools image: `aegis seal schedule`, at the CronJob's time
    unless AEGIS_SEAL_SCHEDULE_UTC says otherwise, health-checked like every service; and every
    schedule `aegis up` runs (entry points aegis.schedules) is a compose service too."""
    service = services()["seal-raw"]
    assert build_args(builds()["seal-raw"])["PACKAGE"] == "aegis-storage-tools"
    assert command_words(service) == ["aegis", "seal", "schedule"]
    assert service.get("restart") == "unless-stopped" and service.get("stop_grace_period")
    assert health_url_port(service) == 8081
    assert set(service["depends_on"]) == {"localstack", "bootstrap"}, "S3 only"
    manifests = yaml.safe_load_all((ROOT / "deploy/k8s/base/seal-raw.yaml").read_text())
    (cron,) = [m for m in manifests if m["kind"] == "CronJob"]
    minute, hour, *_ = cron["spec"]["schedule"].split()
    assert service["environment"]["AEGIS_SEAL_SCHEDULE_UTC"] == (
        f"${{AEGIS_SEAL_SCHEDULE_UTC:-{int(hour):02d}:{int(minute):02d}}}"
    )
    schedules = {
        name
        for member in WORKSPACE.members.values()
        for name in member.entry_points("aegis.schedules")
    }
    assert schedules == {"seal-raw"} and schedules <= set(services())
