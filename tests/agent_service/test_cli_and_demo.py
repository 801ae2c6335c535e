"""The CLI client and the demo (README's first command), run as real processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from agentstate.dev.processes import ServiceProcess
from tests.support.source_example import QUESTION
from tests.support.state_process import StateServices, on_postgres


@pytest.fixture(scope="module")  # one pair of service processes for the module's CLI tests
def agent_address(database_url: str, orders_database_url: str) -> Iterator[str]:
    with StateServices() as states:
        agent = ServiceProcess(
            "agentstate.agent_service",
            {
                "AGENT_LISTEN_ADDRESS": "127.0.0.1:0",
                "AGENT_AUTH_MODE": "dev-header",
                "AGENT_STATE_ADDRESS": states.serve(on_postgres(database_url)),
                "AGENT_PROFILE": "order_demo",
                "ORDERS_DATABASE_URL": orders_database_url,
            },
        )
        yield agent.wait_ready()
        assert agent.terminate() == 0, agent.output


def _cli(
    address: str, user_id: str, *args: str, stdin: str = "", flags: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the CLI; with flags=False the address and user come from its environment."""
    where = ["--address", address, "--user", user_id] if flags else []
    env = {**os.environ, "AGENTSTATE_ADDRESS": address, "AGENTSTATE_USER": user_id}
    return subprocess.run(
        [sys.executable, "-m", "agentstate.agent_service.cli", *where, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env if not flags else None,
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
    # The page's words for a declined call, not the framework's English (issue 14).
    assert "↳ cancel_order denied: 你在确认卡片上点了取消，操作没有执行。" in history.stdout
    assert '⚙ cancel_order {"orderNo": "88235"}: 你在确认卡片上点了取消' in history.stdout
    assert "Permission denied by user" not in history.stdout

    listed = _cli(agent_address, user_id, "conversations")
    assert conversation_id.group(1) in listed.stdout

    missing = _cli(agent_address, user_id, "history", "42")
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr


def test_cli_confirm_answers_a_card_left_open_earlier(agent_address: str, user_id: str) -> None:
    # An earlier session's terminal closed while the card was asked about.
    chat = _cli(agent_address, user_id, "chat", QUESTION, stdin="")
    assert chat.returncode == 0, chat.stderr
    left = re.search(r"agentstate-cli confirm (\d+) (\d+) --approve\|--deny", chat.stdout)
    assert left is not None, chat.stdout
    conversation_id, card_id = left.groups()
    # Asking something else says how to answer the card.
    refused = _cli(agent_address, user_id, "chat", "查一下别的", "--conversation", conversation_id)
    assert refused.returncode == 1
    assert f"answer it with: agentstate-cli confirm {conversation_id} {card_id}" in refused.stderr
    # A new session (address and user from AGENTSTATE_ADDRESS / AGENTSTATE_USER)
    # shows the stored card, asks, and answers it.
    confirm = _cli(
        agent_address, user_id, "confirm", conversation_id, card_id, stdin="n\n", flags=False
    )
    assert confirm.returncode == 0, confirm.stderr
    assert f"┌ confirmation card {card_id}: 取消订单 88235" in confirm.stdout
    assert "Approve '取消订单 88235'? [y/N]" in confirm.stdout
    assert "这次取消没有执行" in confirm.stdout
    again = _cli(agent_address, user_id, "confirm", conversation_id, card_id, "--approve")
    assert again.returncode == 1 and "already handled" in again.stderr


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
