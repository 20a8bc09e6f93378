"""Build the Step Functions task function's code: ``dist/aegis-orchestrator-task.zip``.

What goes in is exactly the locked runtime of the ``aegis-orchestrator`` package (``uv export
--package aegis-orchestrator --no-dev --frozen``), installed for Lambda's ``python3.13`` on x86_64
from wheels only (so a build machine of any kind makes the same zip): the workspace members it
depends on are built as wheels first and installed as ordinary packages, never as links into this
checkout. No test or development tool (pytest, moto, testcontainers, the devstack) is in the lock's
runtime; the build fails if one turns up anyway, or if the handler
(``aegis_orchestrator.sfn_task.handler``) is missing.

Upload the zip to S3 under a new key for each build and deploy the template of
``aegis jobs export-sfn`` with ``CodeBucket``/``CodeKey`` naming it (docs/orchestration.md).

    python3 deploy/lambda/build.py [--uv "python3 -m uv"] [--out dist/aegis-orchestrator-task.zip]

Its scratch folder is ``.lambda-build`` in the checkout (uv's temporary files: ``.uv-tmp``), removed
when it ends.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "aegis-orchestrator"
HANDLER = "aegis_orchestrator/sfn_task.py"
DEFAULT_OUT = ROOT / "dist" / "aegis-orchestrator-task.zip"
BUILD = ROOT / ".lambda-build"
UV_TMP = ROOT / ".uv-tmp"
PLATFORM = "x86_64-manylinux2014"
PYTHON_VERSION = "3.13"
# top-level names that must never be shipped (test and development tools)
FORBIDDEN = ("pytest", "_pytest", "moto", "testcontainers", "aegis_devstack", "mypy", "ruff")
# Lambda's limit on the unzipped code of a function (250 MB)
UNZIPPED_MAX = 250 * 1024 * 1024
_FIXED_TIME = (2020, 1, 1, 0, 0, 0)  # entries dated alike: the same tree makes the same zip


class BuildError(RuntimeError):
    pass


def run(command: list[str]) -> str:
    env = os.environ | {"TMPDIR": str(UV_TMP), "UV_PYTHON_DOWNLOADS": "never"}
    done = subprocess.run(  # noqa: S603 - fixed argv, no shell
        command, cwd=ROOT, env=env, check=False, capture_output=True, text=True
    )
    if done.returncode:
        raise BuildError(f"{shlex.join(command)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def requirements(uv: list[str], wheels: Path) -> list[str]:
    """The locked runtime of the package; each workspace member (an editable path in the
    export) replaced by a wheel built from it."""
    export = ["export", "--package", PACKAGE, "--no-dev", "--no-hashes", "--frozen"]
    exported = run([*uv, *export, "--no-header", "--no-annotate"])
    lines = []
    for raw in exported.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-e "):
            member = (ROOT / line[3:].strip()).resolve()
            before = set(wheels.glob("*.whl"))
            run([*uv, "build", "--wheel", "--out-dir", str(wheels), str(member)])
            [wheel] = set(wheels.glob("*.whl")) - before
            lines.append(str(wheel))
        else:
            lines.append(line)
    return lines


def check(tree: Path) -> int:
    """Fail on what must not be there (or must); the size of the unzipped tree."""
    shipped = {p.name.split("-")[0].split(".")[0] for p in tree.iterdir()}
    if found := sorted(set(FORBIDDEN) & shipped):
        raise BuildError(f"the build holds test or development tools: {', '.join(found)}")
    if not (tree / HANDLER).is_file():
        raise BuildError(f"the handler module {HANDLER} is not in the build")
    size = sum(p.stat().st_size for p in tree.rglob("*") if p.is_file())
    if size > UNZIPPED_MAX:
        raise BuildError(f"{size} bytes unzipped: Lambda takes at most {UNZIPPED_MAX}")
    return size


def write_zip(tree: Path, out: Path) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".zip.partial")
    count = 0
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for path in sorted(tree.rglob("*")):
            if not path.is_file():
                continue
            info = zipfile.ZipInfo(path.relative_to(tree).as_posix(), _FIXED_TIME)
            info.external_attr = (0o755 if os.access(path, os.X_OK) else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes())
            count += 1
    partial.replace(out)
    return count


def build(uv: list[str], out: Path) -> None:
    shutil.rmtree(BUILD, ignore_errors=True)
    UV_TMP.mkdir(exist_ok=True)
    wheels, tree = BUILD / "wheels", BUILD / "package"
    wheels.mkdir(parents=True)
    try:
        reqs = BUILD / "requirements.txt"
        reqs.write_text("\n".join(requirements(uv, wheels)) + "\n")
        install = ["pip", "install", "--target", str(tree), "--no-deps", "--no-compile"]
        platform = ["--python-platform", PLATFORM, "--python-version", PYTHON_VERSION]
        run([*uv, *install, *platform, "--only-binary", ":all:", "--requirement", str(reqs)])
        for junk in [tree / "bin", *tree.rglob("__pycache__")]:
            shutil.rmtree(junk, ignore_errors=True)
        (tree / ".lock").unlink(missing_ok=True)  # uv's lock of the target folder
        unzipped = check(tree)
        count = write_zip(tree, out)
    finally:
        shutil.rmtree(BUILD, ignore_errors=True)
    print(
        f"{out}: {out.stat().st_size / 1e6:.1f} MB ({count} files, "
        f"{unzipped / 1e6:.1f} MB unzipped), handler aegis_orchestrator.sfn_task.handler"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_uv = "uv" if shutil.which("uv") else f"{sys.executable} -m uv"
    parser.add_argument("--uv", default=default_uv, help="how to run uv (as the Makefile's UV)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    try:
        build(shlex.split(args.uv), args.out.resolve())
    except BuildError as err:
        print(f"lambda build: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
