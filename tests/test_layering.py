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


CONSOLE_MAY_IMPORT = (
    "agentstate.client",
    "agentstate.common",
    "agentstate.agent.v1",  # the agent API stubs
    "agentstate.console",
)


def console_offences(files: list[Path]) -> dict[str, list[str]]:
    """The console's agentstate imports outside what it may use."""
    offending = {
        str(path.relative_to(SRC)): sorted(
            m
            for m in imported_modules(path)
            if (m == "agentstate" or m.startswith("agentstate."))
            and not any(m == p or m.startswith(p + ".") for p in CONSOLE_MAY_IMPORT)
        )
        for path in files
    }
    return {k: v for k, v in offending.items() if v}


def test_the_console_sits_on_the_client_and_the_agent_api_only() -> None:
    files = sorted((SRC / "console").rglob("*.py"))
    assert files
    assert console_offences(files) == {}


def test_the_console_check_sees_state_stubs_and_internals() -> None:
    probe = SRC / "console" / "_probe_not_a_module.py"
    source = (
        "from agentstate.state.v1 import state_service_pb2\n"
        "import agentstate.agent_service.auth\n"
        "from agentstate.client import AsyncStateClient\n"
    )
    probe.write_text(source)
    try:
        found = console_offences([probe])
    finally:
        probe.unlink()
    assert found == {
        "console/_probe_not_a_module.py": [
            "agentstate.agent_service.auth",
            "agentstate.state.v1",
            "agentstate.state.v1.state_service_pb2",
        ]
    }
