""".github/workflows: valid GitHub Actions workflows (the schema check-jsonschema vendors from
SchemaStore, the one GitHub's editors use), every action pinned to a release, and every command
they run names something that exists here: make targets, scripts, test files, the compose ports
the smoke test talks to. The Docker workflow cannot run on this machine (no Docker engine); what
it runs is checked to be what runs here: its smoke test runs in the `make run` end-to-end test."""

from __future__ import annotations

import importlib.resources
import json
import re
import shlex
from pathlib import Path
from typing import Any, cast

import jsonschema
import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
# a release tag, or (what a tag cannot be moved under) the full commit of one
# an action by the commit it runs (a tag can be moved to other code); its release in a comment
PINNED = re.compile(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}")


def schema() -> dict[str, Any]:
    resource = importlib.resources.files("check_jsonschema.builtin_schemas.vendor").joinpath(
        "github-workflows.json"
    )
    return cast("dict[str, Any]", json.loads(resource.read_text(encoding="utf-8")))


def load(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    if True in document:  # YAML 1.1 reads the key `on` as true; GitHub reads "on"
        document["on"] = document.pop(True)
    return cast("dict[str, Any]", document)


def errors(document: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(schema())
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(document)
    ]


def commands(document: dict[str, Any]) -> list[list[str]]:
    found = []
    for job in document["jobs"].values():
        for step in job["steps"]:
            if "run" in step:
                for line in step["run"].replace(" && ", "\n").splitlines():
                    if line.strip():
                        found.append(shlex.split(line))
    return found


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([a-zA-Z0-9_./-]+):", text, flags=re.MULTILINE)) | {
        ".venv/bin/kubectl"
    }


def test_there_is_a_docker_workflow() -> None:
    assert ROOT / ".github" / "workflows" / "docker.yml" in WORKFLOWS


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_is_valid_with_timeouts_and_actions_pinned_by_commit_keeping_no_credentials(
    path: Path,
) -> None:
    document = load(path)
    assert errors(document) == []
    text = path.read_text(encoding="utf-8")
    for job in document["jobs"].values():
        assert job.get("timeout-minutes"), "a job without a timeout can run for six hours"
        for step in job["steps"]:
            if "uses" not in step:
                continue
            assert PINNED.fullmatch(step["uses"]), f"{step['uses']}: pin the release's commit"
            assert re.search(rf"{re.escape(step['uses'])} # v\d", text), "name the release"
            if step["uses"].startswith("actions/checkout@"):
                # the token stays out of .git/config, where a later step could read it
                assert step.get("with", {}).get("persist-credentials") is False


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_what_the_workflow_runs_exists_here(path: Path) -> None:
    targets = make_targets()
    for words in commands(load(path)):
        if words[0] == "make":
            for target in words[1:]:
                assert target in targets, f"make {target}: no such target"
        for word in words:
            if word.startswith(("tests/", ".venv/bin/python")) and word.endswith(".py"):
                assert (ROOT / word).is_file(), f"{word} does not exist"
        if words[0] == ".venv/bin/pytest":
            for i, word in enumerate(words):
                if word == "--deselect":
                    assert (ROOT / words[i + 1]).is_file(), words[i + 1]


def test_the_smoke_test_talks_to_ports_compose_publishes() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text(encoding="utf-8"))
    published = {
        int(str(p).split(":")[-2])
        for service in compose["services"].values()
        for p in service.get("ports", [])
    }
    smoke = [
        w
        for w in commands(load(ROOT / ".github" / "workflows" / "docker.yml"))
        if "tests/tools/smoke.py" in w
    ]
    assert smoke, "the compose job runs no smoke test"
    urls = [w for w in smoke[0] if "://" in w]
    ports = {int(u.rsplit(":", 1)[1]) for u in urls}
    assert ports == {1883, 4566, 8080} and ports <= published


def test_a_broken_workflow_is_refused() -> None:
    """The schema check can fail: a misspelt key and a step with nothing to do are found."""
    document = load(ROOT / ".github" / "workflows" / "docker.yml")
    document["jobs"]["compose"]["runs-onn"] = document["jobs"]["compose"].pop("runs-on")
    document["jobs"]["containers"]["steps"].append({"name": "nothing"})
    found = "\n".join(errors(document))
    assert "jobs/compose" in found and "jobs/containers" in found
