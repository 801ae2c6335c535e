"""A listening address already in use (issue 27): one line naming the address and the
setting that changes it, exit status 2, nothing started. Real processes, a real socket
holding the port."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agentstate.common.config import ConfigError
from agentstate.common.grpc_server import bind, create_server
from tests.support import paths


@pytest.fixture
def taken() -> Iterator[str]:
    """host:port of a socket that listens for the whole test."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield f"127.0.0.1:{holder.getsockname()[1]}"


def run(module: str, env: dict[str, str], *args: str) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout.splitlines()


def in_use(program: str, address: str, setting: str) -> str:
    return (
        f"{program}: cannot listen on {address}: the address is already in use; "
        f"{setting} another address (port 0 picks a free one)"
    )


def test_the_state_service_on_a_port_in_use_starts_nothing(
    taken: str, world_traversable_dir: Path
) -> None:
    tmp = world_traversable_dir / "tmp"
    tmp.mkdir()
    data_dir = world_traversable_dir / "pgdata"
    code, lines = run(
        "agentstate.state_service",
        {
            "STATE_LISTEN_ADDRESS": taken,
            "STATE_STORE": "embedded",
            "STATE_EMBEDDED_PG_DIR": str(data_dir),
            "DATABASE_URL": "",
            "TMPDIR": str(tmp),
        },
    )
    assert (code, lines) == (
        2,
        [in_use("agentstate-state", taken, "set STATE_LISTEN_ADDRESS to")],
    )
    assert not data_dir.exists() and not list(tmp.iterdir())  # no database was started


def test_the_agent_service_on_a_port_in_use(taken: str) -> None:
    code, lines = run(
        "agentstate.agent_service",
        {
            "AGENT_LISTEN_ADDRESS": taken,
            "AGENT_AUTH_MODE": "dev-header",
            "AGENT_STATE_ADDRESS": "127.0.0.1:1",
            "AGENT_PROFILE": "order_demo",
            "ORDERS_DATABASE_URL": "",
        },
    )
    assert (code, lines[-1:]) == (
        2,
        [in_use("agentstate-agent", taken, "set AGENT_LISTEN_ADDRESS to")],
    )
    # Before it: only the warning a dev-header service always logs at start.
    assert [line for line in lines[:-1] if "dev-header" not in line] == [], lines


def test_the_console_on_a_port_in_use(taken: str) -> None:
    code, lines = run(
        "agentstate.console",
        {"CONSOLE_LISTEN_ADDRESS": taken, "CONSOLE_DEV_USER": "admin", "CONSOLE_USER_HEADER": ""},
    )
    assert (code, lines) == (
        2,
        [in_use("agentstate-console", taken, "set CONSOLE_LISTEN_ADDRESS to")],
    )


def test_the_web_demo_on_a_port_in_use_starts_nothing(taken: str) -> None:
    code, lines = run("agentstate.examples.order_demo.demo", {}, "--web", "--web-address", taken)
    assert (code, lines) == (2, [in_use("agentstate-demo", taken, "give --web-address")])


def test_a_port_taken_after_the_check_is_still_one_line(taken: str) -> None:
    """gRPC itself refusing the address (the check passed a moment earlier)."""

    # In its own event loop, as the services create theirs: an earlier test that closed
    # the thread's loop must not leave grpc.aio without one.
    async def create_and_bind() -> grpc.aio.Server:
        server = create_server(max_message_bytes=1024)
        bind(server, taken, "STATE_LISTEN_ADDRESS")
        return server

    with pytest.raises(ConfigError) as refused:
        asyncio.run(create_and_bind())
    assert str(refused.value) == (
        f"cannot listen on {taken}: gRPC could not bind it; set STATE_LISTEN_ADDRESS to "
        "another address (port 0 picks a free one)"
    )


def test_the_docs_quote_the_message() -> None:
    running = " ".join((paths.REPO / "docs" / "running.md").read_text().split())
    assert in_use("agentstate-state", "127.0.0.1:50051", "set STATE_LISTEN_ADDRESS to") in running
