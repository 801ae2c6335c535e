"""The contract gate: `buf breaking` against the released v1 baseline catches real breaks."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.support import paths

REPO = paths.REPO
BUF = REPO / "tools" / "node_modules" / ".bin" / "buf"


def _breaking(protos: Path) -> subprocess.CompletedProcess[str]:
    assert BUF.exists(), "buf is missing: run `npm ci` in tools/ (./run setup does)"
    return subprocess.run(
        [str(BUF), "breaking", "--against", str(REPO / "protos/baseline/v1-image.json")],
        cwd=protos,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_current_contract_is_compatible_with_the_baseline() -> None:
    result = _breaking(REPO / "protos")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_breaking_change_is_caught(tmp_path: Path) -> None:
    copy = tmp_path / "protos"
    shutil.copytree(REPO / "protos", copy)
    proto = copy / "agentstate/state/v1/state_service.proto"
    text = proto.read_text()
    changed = text.replace("  int64 version = 2;", "  int32 version = 2;", 1)
    assert changed != text
    proto.write_text(changed)
    result = _breaking(copy)
    assert result.returncode != 0
    assert 'changed type from "int64" to "int32"' in result.stdout


def test_an_additive_change_passes(tmp_path: Path) -> None:
    copy = tmp_path / "protos"
    shutil.copytree(REPO / "protos", copy)
    proto = copy / "agentstate/state/v1/state_service.proto"
    proto.write_text(
        proto.read_text()
        + "\n// A message a later release might add.\nmessage FutureThing {\n"
        + "  // A field.\n  string name = 1;\n}\n"
    )
    result = _breaking(copy)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_go_package_change_is_caught(tmp_path: Path) -> None:
    """go_package is the import path of every Go caller's generated code: changing it breaks
    their builds though not the wire, so FILE_SAME_GO_PACKAGE stays on (the baseline was
    re-recorded once, when go_package was first set)."""
    copy = tmp_path / "protos"
    shutil.copytree(REPO / "protos", copy)
    proto = copy / "agentstate/state/v1/state_service.proto"
    text = proto.read_text()
    changed = text.replace("/gen/go/agentstate/state/v1;statev1", "/go/state/v1;statev1", 1)
    assert changed != text
    proto.write_text(changed)
    result = _breaking(copy)
    assert result.returncode != 0
    assert 'File option "go_package" changed' in result.stdout
