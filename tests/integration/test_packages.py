"""The workspace's packages, each with one role, and what an image of each installs.

* Layering: contracts, then storage, then the service shell (aegis-runtime), then the operator
  CLI (aegis-cli), then services; the development stack (aegis-devstack) sits on top and only the
  workspace's dev dependencies pull it in. A package imports only packages below it, and no
  module of a package imports itself back through others of it.
* Every import in a package's source is the standard library, the package itself, or a
  distribution it declares (so an image, which installs exactly the declared ones, can run it).
* No production dependency set (``uv export --no-dev --package``, what the Dockerfile installs)
  contains a test or emulator tool.
"""

from __future__ import annotations

import ast
import graphlib
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from aegis_devstack.testing.workspace import Member, Workspace

ROOT = Path(__file__).resolve().parents[2]
WORKSPACE = Workspace(ROOT)
# the order of the libraries: each may depend only on those before it
LAYERS = ["aegis-contracts", "aegis-storage", "aegis-runtime", "aegis-cli"]
PLAIN_LIBS = {"aegis-folds": 2, "aegis-orchestration": 2}  # rank: after storage
DEV_ONLY = "aegis-devstack"
NOT_IN_IMAGES = ("pytest", "moto", "testcontainers", "playwright", "aegis-devstack", "hypothesis")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _rank(member: str) -> float:
    if member in LAYERS:
        return LAYERS.index(member)
    if member in PLAIN_LIBS:
        return PLAIN_LIBS[member] + 0.5
    if member == DEV_ONLY:
        return 100
    return 10  # a service


def _runtime_imports(path: Path) -> set[str]:
    """The modules a source file imports at run time, module-level or inside functions (not
    those for the type checker only), as dotted names: ``from a.b import c`` gives ``a.b`` and
    ``a.b.c`` (``c`` may be a module of its own)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }  # imports for the type checker only: not needed at run time
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _imports(member: Member) -> dict[str, set[str]]:
    """Top-level names imported anywhere in the member's source (module-level or inside
    functions), each with the files that import it."""
    found: dict[str, set[str]] = {}
    for path in sorted((member.path / "src").rglob("*.py")):
        for name in _runtime_imports(path):
            found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


def _module_graph(member: Member) -> dict[str, set[str]]:
    """Each module of the member's source with the member's modules it imports at run time."""
    src = member.path / "src"
    paths = {
        ".".join(p.relative_to(src).with_suffix("").parts).removesuffix(".__init__"): p
        for p in sorted(src.rglob("*.py"))
    }

    def module_of(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    return {
        module: {m for n in _runtime_imports(path) if (m := module_of(n)) not in (None, module)}
        for module, path in paths.items()
    }


def test_the_libraries_form_layers_and_nothing_imports_upward() -> None:
    problems = []
    for name, member in WORKSPACE.members.items():
        for dep in member.requires:
            if dep in WORKSPACE.members and _rank(dep) >= _rank(name):
                problems.append(f"{name} depends on {dep}, which is not below it")
        if name != DEV_ONLY and name.startswith("aegis-") and _rank(name) < 10:
            for module, files in _imports(member).items():
                dist = _norm(module)
                if dist.startswith("aegis-") and dist != name and dist not in member.requires:
                    problems.append(f"{name} imports {module} ({sorted(files)[0]})")
    assert not problems, "\n".join(problems)
    assert DEV_ONLY not in {
        dep for member in WORKSPACE.members.values() for dep in member.requires
    }, "a workspace member depends on the development stack"


@pytest.mark.parametrize("name", sorted(WORKSPACE.members))
def test_no_module_of_a_package_imports_itself_back(name: str) -> None:
    """No cycle among a package's modules, counting the imports made inside functions: an
    import put off until a call hides a cycle from Python, not from a reader."""
    graph = _module_graph(WORKSPACE.members[name])
    assert graph, f"{name}: no module found"
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        pytest.fail(f"{name}: its modules import each other in a cycle: {' -> '.join(err.args[1])}")


@pytest.mark.parametrize("name", sorted(WORKSPACE.members))
def test_every_import_is_declared(name: str) -> None:
    member = WORKSPACE.members[name]
    provided = packages_distributions()
    declared = {_norm(dep) for dep in member.requires} | {_norm(name)}
    missing = []
    for module, files in sorted(_imports(member).items()):
        if module in sys.stdlib_module_names or module == "__future__":
            continue
        dists = {_norm(d) for d in provided.get(module, [])} or {_norm(module)}
        if not dists & declared:
            missing.append(f"{module} (from {sorted(dists)}) in {sorted(files)[0]}")
    assert not missing, f"{name} imports what it does not declare:\n" + "\n".join(missing)


def _image_packages() -> list[str]:
    """What the Dockerfile builds: every service and the operator CLI's one-shot image."""
    services = [name for name, m in WORKSPACE.members.items() if m.path.parent.name == "services"]
    return [*sorted(services), "aegis-cli"]


@pytest.mark.parametrize("package", _image_packages())
def test_no_image_installs_test_or_emulator_tools(package: str) -> None:
    uv = shutil.which("uv")
    command = [uv] if uv else [sys.executable, "-m", "uv"]
    exported = subprocess.run(
        [
            *command,
            "export",
            "--frozen",
            "--no-dev",
            "--no-hashes",
            "--no-emit-workspace",
            "--package",
            package,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "UV_NO_PROGRESS": "1"},
    ).stdout
    installed = {
        _norm(match[1])
        for line in exported.splitlines()
        if (match := re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)", line))
    }
    assert installed, f"uv export printed no requirements for {package}:\n{exported}"
    shipped = sorted(set(map(_norm, NOT_IN_IMAGES)) & installed)
    assert not shipped, f"the {package} image would install {shipped}"
