"""The CLI on the paths a new operator walks (issue 27): Ctrl-C in a chat, a card that was
already answered, an error after a streamed error message, a jwt service and no token.

Real processes: a state service, agent services (jwt with the order demo and a slowed
scripted model; one whose model endpoint is unreachable), and the CLI itself.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentstate.agent_service.runtime import texts
from agentstate.dev.processes import ServiceProcess
from tests.agent_service.test_auth import jwt_agent_env, token
from tests.support.source_example import QUESTION

CLI = [sys.executable, "-m", "agentstate.agent_service.cli"]


@pytest.fixture(scope="module")
def jwt_agent_address(
    state_process_address: str, orders_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The order demo behind jwt (the default mode), its model slowed so a turn takes a
    few seconds: long enough to press Ctrl-C in the middle of one."""
    env = jwt_agent_env(state_process_address, orders_database_url, tmp_path_factory.mktemp("jwks"))
    agent = ServiceProcess(
        "agentstate.agent_service", {**env, "AGENT_SCRIPTED_STEP_DELAY_SECONDS": "0.7"}
    )
    yield agent.wait_ready()
    assert agent.terminate() == 0, agent.output


def cli_env(address: str, user: str | None) -> dict[str, str]:
    """The CLI's environment: the user's access token, or none at all."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSTATE_")}
    env["AGENTSTATE_ADDRESS"] = address
    if user is not None:
        env["AGENTSTATE_TOKEN"] = token(user)
    return env


def cli(address: str, user: str | None, *args: str, stdin: str = "") -> tuple[int, str]:
    """Run the CLI; its exit code and what the terminal shows (stdout and stderr as one)."""
    done = subprocess.run(
        [*CLI, *args],
        input=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
        check=False,
        env=cli_env(address, user),
    )
    return done.returncode, done.stdout


def test_ctrl_c_in_a_chat_says_the_turn_goes_on_and_how_to_stop_it(
    jwt_agent_address: str, user_id: str
) -> None:
    chat = subprocess.Popen(
        [*CLI, "chat", QUESTION, "--deny"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=cli_env(jwt_agent_address, user_id),
        # As from a terminal: a suite started in the background (`./run test &`) passes
        # SIGINT on ignored, and Python then installs no KeyboardInterrupt for it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert chat.stdout is not None
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        assert chat.stdout is not None
        for line in chat.stdout:
            lines.append(line)
            if line.startswith("[conversation "):
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert started.wait(30), "".join(lines)
        chat.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal sends
        code = chat.wait(30)
    finally:
        if chat.poll() is None:
            chat.kill()
    reader.join(10)
    shown = "".join(lines)
    meta = re.search(r"\[conversation (\d+) · task (\S+)\]", shown)
    assert meta is not None, shown
    conversation_id, task_id = meta.groups()
    assert code == 130, shown
    assert "Traceback" not in shown and "KeyboardInterrupt" not in shown, shown
    assert shown.endswith(
        "agentstate-cli: interrupted; the turn goes on in the agent service.\n"
        f"  stop it with: agentstate-cli stop {task_id}\n"
        f"  see it with:  agentstate-cli history {conversation_id}\n"
    ), shown

    # The command it names works: the turn was still running, and stops.
    code, stopped = cli(jwt_agent_address, user_id, "stop", task_id)
    assert (code, stopped) == (0, f"asked the turn of conversation {conversation_id} to stop\n")


def test_confirm_without_a_flag_on_an_answered_card_says_so(
    jwt_agent_address: str, user_id: str
) -> None:
    code, shown = cli(jwt_agent_address, user_id, "chat", QUESTION, "--deny")
    assert code == 0, shown
    conversation_id = re.search(r"\[conversation (\d+)", shown)
    card_id = re.search(r"confirmation card (\d+)", shown)
    assert conversation_id is not None and card_id is not None, shown

    code, shown = cli(
        jwt_agent_address, user_id, "confirm", conversation_id[1], card_id[1], stdin="y\n"
    )
    assert code == 1, shown
    assert shown == (
        f"agentstate-cli: card {card_id[1]} (取消订单 88235) was already answered: "
        "declined; there is nothing to confirm\n"
    )


def test_without_a_token_a_jwt_service_is_answered_with_the_variable_to_set(
    jwt_agent_address: str,
) -> None:
    code, shown = cli(jwt_agent_address, None, "conversations")
    assert code == 1, shown
    assert shown == (
        "agentstate-cli: UNAUTHENTICATED: the agent service wants the end user's access "
        "token: set AGENTSTATE_TOKEN\n"
    )


def test_an_expired_or_refused_token_names_the_variable_that_holds_it(
    jwt_agent_address: str,
) -> None:
    for access_token, said in [
        (token("alice", exp=int(time.time()) - 600), "has expired: set a new one"),
        (token("alice", aud="another-service"), "was refused: it is not a valid token"),
    ]:
        env = {**cli_env(jwt_agent_address, None), "AGENTSTATE_TOKEN": access_token}
        done = subprocess.run(
            [*CLI, "conversations"], capture_output=True, text=True, timeout=60, env=env
        )
        assert done.returncode == 1, done.stderr
        assert done.stderr.startswith(
            f"agentstate-cli: UNAUTHENTICATED: the access token in AGENTSTATE_TOKEN {said}"
        ), done.stderr


def test_the_error_line_starts_a_line_of_its_own(
    state_process_address: str, orders_database_url: str
) -> None:
    """A model failure streams an error message, then the call fails: two lines."""
    agent = ServiceProcess(
        "agentstate.agent_service",
        {
            "AGENT_LISTEN_ADDRESS": "127.0.0.1:0",
            "AGENT_AUTH_MODE": "dev-header",
            "AGENT_STATE_ADDRESS": state_process_address,
            "AGENT_MODEL": "openai",
            "OPENAI_API_KEY": "unused",
            "OPENAI_BASE_URL": "http://127.0.0.1:1/v1",  # nothing listens there
            "OPENAI_MAX_RETRIES": "0",
        },
    )
    try:
        address = agent.wait_ready()
        env = {**cli_env(address, None), "AGENTSTATE_USER": "operator"}
        done = subprocess.run(
            [*CLI, "chat", "你好"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=60,
            check=False,
            env=env,
        )
    finally:
        assert agent.terminate() == 0, agent.output
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout
    assert lines[-2] == f"error: {texts.MODEL_FAILED_UNREACHABLE}", lines
    assert lines[-1].startswith("agentstate-cli: UNAVAILABLE: "), lines


def test_cli_texts_match_the_docs() -> None:
    """docs/running.md quotes the CLI's messages as the tests above see them."""
    running = Path(__file__).parents[2] / "docs" / "running.md"
    readme = " ".join(running.read_text().split())
    for quoted in (
        "agentstate-cli: interrupted; the turn goes on in the agent service.",
        "stop it with: agentstate-cli stop TASK_ID",
        "was already answered: declined; there is nothing to confirm",
        "the agent service wants the end user's access token: set AGENTSTATE_TOKEN",
    ):
        assert quoted in readme, quoted
