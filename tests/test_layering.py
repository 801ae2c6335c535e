"""Dependencies point down, and the two distributions stay apart.

agentstate-client (client/src/agentstate/: client, the generated stubs, integrations)
imports nothing of the servers (src/agentstate/: state_service, agent_service, common,
console, dev, examples); common imports neither service.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from tests.support.paths import REPO

SRC = REPO / "src" / "agentstate"  # the servers' half of the namespace package
CLIENT_SRC = REPO / "client" / "src" / "agentstate"  # agentstate-client's half
SERVICES = ("agentstate.state_service", "agentstate.agent_service")
SERVER_PACKAGES = (
    *SERVICES,
    "agentstate.common",
    "agentstate.console",
    "agentstate.dev",
    "agentstate.examples",
)


def module_package(path: Path) -> str:
    """The package a source file is in (`agentstate.client` for client/.../client/aio.py)."""
    for root in (SRC, CLIENT_SRC):
        if path.is_relative_to(root):
            return ".".join(path.relative_to(root.parent).with_suffix("").parts[:-1])
    raise ValueError(f"{path} is in neither source root")


def imported_modules(path: Path, package: str = "") -> set[str]:
    """Every module a file imports (absolute names; relative imports resolved)."""
    package = package or module_package(path)
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


def offences(files: list[Path], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    found = {
        str(path.relative_to(REPO)): sorted(
            m for m in imported_modules(path) if m.startswith(forbidden)
        )
        for path in files
    }
    return {k: v for k, v in found.items() if v}


def test_the_client_distribution_imports_nothing_of_the_servers() -> None:
    """client, the stubs and the framework adapters: no service, no common, no console."""
    files = sorted(CLIENT_SRC.rglob("*.py"))
    assert {p.relative_to(CLIENT_SRC).parts[0] for p in files} == {
        "client",
        "state",
        "agent",
        "integrations",
    }
    assert offences(files, SERVER_PACKAGES) == {}


def test_common_imports_no_service() -> None:
    files = sorted((SRC / "common").rglob("*.py"))
    assert files
    assert offences(files, SERVICES) == {}


def test_the_halves_of_the_namespace_package_do_not_overlap() -> None:
    """agentstate has no __init__.py in either root, and no subpackage is in both."""
    assert not (SRC / "__init__.py").exists()
    assert not (CLIENT_SRC / "__init__.py").exists()
    servers = {p.name for p in SRC.iterdir() if p.is_dir() and p.name != "__pycache__"}
    clients = {p.name for p in CLIENT_SRC.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert servers == {name.removeprefix("agentstate.") for name in SERVER_PACKAGES}
    assert not servers & clients


def test_the_check_sees_a_server_import(tmp_path: Path) -> None:
    """The check can fail: absolute and relative service imports are both caught."""
    probe = tmp_path / "x.py"
    probe.write_text(
        "from agentstate.state_service import domain\n"
        "import agentstate.agent_service.errors\n"
        "from ..state_service.storage import sql\n"
        "from agentstate.common.config import EnvSettings\n"
    )
    found = imported_modules(probe, package="agentstate.client")
    assert {m for m in found if m.startswith(SERVER_PACKAGES)} >= {
        "agentstate.state_service",
        "agentstate.agent_service.errors",
        "agentstate.state_service.storage",
        "agentstate.common.config",
    }


def test_the_client_needs_grpc_and_protobuf_only_and_frameworks_are_extras() -> None:
    """agentstate-client's core install is grpcio, grpcio-status and protobuf; each agent
    framework is one of its extras; the servers depend on it."""
    client = tomllib.loads((REPO / "client" / "pyproject.toml").read_text())["project"]
    assert client["name"] == "agentstate-client"
    core = sorted(req.split(">")[0].split("=")[0] for req in client["dependencies"])
    assert core == ["grpcio", "grpcio-status", "protobuf"]
    extras = client["optional-dependencies"]
    for extra, package in (
        ("langgraph", "langgraph"),
        ("openai-agents", "openai-agents"),
        ("adk", "google-adk"),
    ):
        assert any(req.startswith(package) for req in extras[extra]), extra
    servers = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert f"agentstate-client=={client['version']}" in servers["dependencies"]
    assert servers["version"] == client["version"]  # released together


CONSOLE_MAY_IMPORT = (
    "agentstate.client",
    "agentstate.common",
    "agentstate.agent.v1",  # the agent API stubs
    "agentstate.console",
)


def console_offences(files: list[Path]) -> dict[str, list[str]]:
    """The console's agentstate imports outside what it may use."""
    offending = {
        path.name: sorted(
            m
            for m in imported_modules(path, package="agentstate.console")
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


def test_the_console_check_sees_state_stubs_and_internals(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from agentstate.state.v1 import state_service_pb2\n"
        "import agentstate.agent_service.auth\n"
        "from agentstate.client import AsyncStateClient\n"
    )
    assert console_offences([probe]) == {
        "probe.py": [
            "agentstate.agent_service.auth",
            "agentstate.state.v1",
            "agentstate.state.v1.state_service_pb2",
        ]
    }
