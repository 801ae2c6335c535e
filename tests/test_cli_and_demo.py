"""The CLI client and the demo (README's main command), run as real processes."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from agentstate.dev.processes import ServiceProcess
from tests.source_example import QUESTION


@pytest.fixture
def agent_address(database_url: str, orders_database_url: str) -> Iterator[str]:
    state = ServiceProcess(
        "agentstate.state_service",
        {
            "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
            "STATE_STORE": "postgres",
            "DATABASE_URL": database_url,
        },
    )
    agent = ServiceProcess(
        "agentstate.agent_service",
        {
            "AGENT_LISTEN_ADDRESS": "127.0.0.1:0",
            "AGENT_AUTH_MODE": "dev-header",
            "AGENT_STATE_ADDRESS": state.wait_ready(),
            "AGENT_PROFILE": "order_demo",
            "ORDERS_DATABASE_URL": orders_database_url,
        },
    )
    yield agent.wait_ready()
    assert agent.terminate() == 0, agent.output
    assert state.terminate() == 0, state.output


def _cli(
    address: str, user_id: str, *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "agentstate.agent_service.cli",
            "--address",
            address,
            "--user",
            user_id,
            *args,
        ],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_asks_about_the_card_and_shows_history(agent_address: str, user_id: str) -> None:
    chat = _cli(agent_address, user_id, "chat", QUESTION, stdin="n\n")
    assert chat.returncode == 0, chat.stderr
    out = chat.stdout
    assert "confirmation card" in out and "取消订单 88235" in out
    assert "Approve '取消订单 88235'? [y/N]" in out
    assert "> cancel" in out
    assert "这次取消没有执行" in out and "3378.00" in out
    conversation_id = re.search(r"\[conversation (\d+)", out)
    assert conversation_id is not None

    history = _cli(agent_address, user_id, "history", conversation_id.group(1))
    assert history.returncode == 0, history.stderr
    assert history.stdout.count("── ") == 3
    assert "↳ cancel_order denied: Permission denied by user" in history.stdout

    listed = _cli(agent_address, user_id, "conversations")
    assert conversation_id.group(1) in listed.stdout

    missing = _cli(agent_address, user_id, "history", "42")
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr


def test_cli_approve_flag(agent_address: str, user_id: str) -> None:
    chat = _cli(agent_address, user_id, "chat", QUESTION, "--approve")
    assert chat.returncode == 0, chat.stderr
    assert "> approve" in chat.stdout and "已经帮你取消了" in chat.stdout


def test_demo_runs_the_example_end_to_end() -> None:
    demo = subprocess.run(
        [sys.executable, "-m", "agentstate.examples.order_demo.demo"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    out = demo.stdout
    assert "┌ confirmation card" in out
    assert "订单88235目前还是已支付待发货状态" in out
    assert "8 messages in context" in out
    assert "6. ASSISTANT thinking, text, tool_use cancel_order (asking)" in out
    assert "7. TOOL      tool_result cancel_order (denied)" in out
    assert "both services stopped cleanly" in out
