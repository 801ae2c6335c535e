"""Dependencies point down: the client and common import neither service."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "agentstate"
SERVICES = ("agentstate.state_service", "agentstate.agent_service")


def imported_modules(path: Path, package: str = "") -> set[str]:
    """Every module a file imports (absolute names; relative imports resolved)."""
    package = package or ".".join(path.relative_to(SRC.parent).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base]) if base else ".".join(parts)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize("layer", ["client", "common", "integrations"])
def test_lower_layers_import_no_service(layer: str) -> None:
    files = sorted((SRC / layer).rglob("*.py"))
    assert files
    offending = {
        str(path.relative_to(SRC)): sorted(
            m for m in imported_modules(path) if m.startswith(SERVICES)
        )
        for path in files
    }
    assert {k: v for k, v in offending.items() if v} == {}


def test_the_check_sees_a_service_import(tmp_path: Path) -> None:
    """The check can fail: absolute and relative service imports are both caught."""
    probe = tmp_path / "x.py"
    probe.write_text(
        "from agentstate.state_service import domain\n"
        "import agentstate.agent_service.errors\n"
        "from ..state_service.storage import sql\n"
    )
    found = imported_modules(probe, package="agentstate.client")
    assert {m for m in found if m.startswith(SERVICES)} >= {
        "agentstate.state_service",
        "agentstate.agent_service.errors",
        "agentstate.state_service.storage",
    }


def test_integrations_import_no_service() -> None:
    """The framework adapters sit on the client only (never the services' internals)."""
    test_lower_layers_import_no_service("integrations")


def test_frameworks_are_optional_extras() -> None:
    """The core install does not pull the agent frameworks in: each is an extra."""
    import tomllib

    project = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    extras = project["optional-dependencies"]
    for extra, package in (("openai-agents", "openai-agents"), ("adk", "google-adk")):
        assert package not in core
        assert any(req.startswith(package) for req in extras[extra])
