"""The web console without a browser: settings, identity, words, `./run demo --web`.

The browser tests are tests/console/test_console_browser.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.common.config import ConfigError
from agentstate.console import app
from agentstate.console.config import ConsoleSettings
from agentstate.console.present import event_view, record_view

pytest.importorskip("starlette")

INTERNAL = ("asking", "denied", "allowed", "AWAITING", "STREAMING", "INTERRUPTED", "pending")


def test_settings_need_a_way_to_know_the_user() -> None:
    with pytest.raises(ConfigError, match=r"set CONSOLE_USER_HEADER .* or CONSOLE_DEV_USER"):
        ConsoleSettings.from_env({})
    assert ConsoleSettings.from_env({"CONSOLE_DEV_USER": "me"}).dev_user == "me"
    with pytest.raises(ConfigError, match="CONSOLE_HISTORY_PAGE_SIZE=0 must be at least 1"):
        ConsoleSettings.from_env({"CONSOLE_DEV_USER": "me", "CONSOLE_HISTORY_PAGE_SIZE": "0"})


def test_the_console_refuses_to_start_without_an_identity_source() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "agentstate.console"],
        env={"PATH": "/usr/bin:/bin", "CONSOLE_LISTEN_ADDRESS": "127.0.0.1:0"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2
    assert "agentstate-console: set CONSOLE_USER_HEADER" in run.stderr


def _record(
    blocks: list[dict[str, object]], status: Any, card: dict[str, object] | None = None
) -> pb.MessageRecord:
    return pb.MessageRecord(
        message_id="2",
        conversation_id="1",
        role=pb.MESSAGE_ROLE_ASSISTANT,
        blocks_json=json.dumps(blocks).encode(),
        status=status,
        metadata_json=json.dumps({"card": card} if card else {}).encode(),
    )


def _card(status: str, expires_in: float = 600) -> dict[str, object]:
    expires = datetime.now(UTC) + timedelta(seconds=expires_in)
    return {
        "record_id": "2",
        "title": "取消订单 88235",
        "expires_at": expires.isoformat(),
        "status": status,
        "calls": [
            {
                "call_id": "c1",
                "name": "cancel_order",
                "title": "取消订单 88235",
                "fields": [["订单号", "88235"]],
            }
        ],
    }


USE = {
    "type": "tool_use",
    "id": "c1",
    "name": "cancel_order",
    "input": {"orderNo": "88235"},
    "state": "asking",
}


@pytest.mark.parametrize(
    ("blocks", "status", "card", "tool_words", "card_words"),
    [
        (
            [USE],
            pb.MESSAGE_STATUS_AWAITING_CONFIRM,
            _card("pending"),
            "Waiting for your confirmation",
            "Waiting for your decision",
        ),
        (
            [USE],
            pb.MESSAGE_STATUS_NORMAL,
            _card("denied"),
            "Declined by you: not run",
            "Declined by you: nothing was done",
        ),
        ([USE], pb.MESSAGE_STATUS_NORMAL, _card("approved"), "Approved by you", "Approved by you"),
        (
            [USE],
            pb.MESSAGE_STATUS_NORMAL,
            _card("expired"),
            "The card expired: not run",
            "Expired: nothing was done",
        ),
        # A pending card past its expiry is shown as expired, not as still open.
        (
            [USE],
            pb.MESSAGE_STATUS_AWAITING_CONFIRM,
            _card("pending", -1),
            "Waiting for your confirmation",
            "Expired: nothing was done",
        ),
        # The record's own outcome wins when the agent wrote one, in the console's words
        # (its outcome_text is the item's detail).
        (
            [{**USE, "outcome": "finished", "outcome_text": "订单88235已取消。"}],
            pb.MESSAGE_STATUS_NORMAL,
            _card("approved"),
            "Done",
            "Approved by you",
        ),
        (
            [{**USE, "outcome": "interrupted"}],
            pb.MESSAGE_STATUS_INTERRUPTED,
            None,
            "Not run: the turn was stopped",
            None,
        ),
        (
            [
                USE,
                {
                    "type": "tool_result",
                    "id": "c1",
                    "name": "cancel_order",
                    "state": "error",
                    "output": [{"type": "text", "text": "订单已发货\nmore"}],
                },
            ],
            pb.MESSAGE_STATUS_NORMAL,
            None,
            "Failed: 订单已发货",
            None,
        ),
    ],
)
def test_records_are_told_in_words_not_status_names(
    blocks: list[dict[str, object]],
    status: int,
    card: dict[str, object] | None,
    tool_words: str,
    card_words: str | None,
) -> None:
    view = record_view(_record(blocks, status, card))
    (tool,) = [i for i in view["items"] if i["kind"] == "tool"]
    assert tool["words"] == tool_words
    assert (view["card"] or {}).get("words") == card_words
    if card_words == "Expired: nothing was done":
        assert view["card"]["open"] is False  # no buttons on an expired card
    shown = json.dumps([tool["words"], view["status_words"], card_words], ensure_ascii=False)
    assert not [name for name in INTERNAL if name in shown]


def test_demo_web_starts_all_three_and_prints_the_url() -> None:
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentstate.examples.order_demo.demo",
            "--web",
            "--web-address",
            "127.0.0.1:0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # The wiring is what is tested here; an in-memory store spares a PostgreSQL start
        # (test_cli_and_demo.py runs the demo on its embedded PostgreSQL).
        env={**os.environ, "STATE_STORE": "memory"},
    )
    assert demo.stdout is not None
    lines: list[str] = []
    url = ""
    deadline = time.monotonic() + 90
    try:
        while not url and time.monotonic() < deadline:
            line = demo.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("web console: "):
                url = line.split()[2]
        assert url.startswith("http://127.0.0.1:"), "".join(lines)
        with urllib.request.urlopen(url + "/api/me", timeout=10) as response:
            assert json.load(response) == {"user": "admin", "trace_url_template": ""}
        with urllib.request.urlopen(url + "/healthz", timeout=10) as response:
            assert json.load(response) == {"ok": True}  # the Kubernetes probes' path
        with urllib.request.urlopen(url, timeout=10) as response:
            assert "<title>agentstate console</title>" in response.read().decode()
    finally:
        demo.send_signal(signal.SIGTERM)
        rest, _ = demo.communicate(timeout=60)
    assert demo.returncode == 0, "".join(lines) + rest


def test_an_error_record_shows_the_streamed_text_as_partial_and_the_metadata_error() -> None:
    sentence = "模型响应超时，这一轮没有完成，请稍后重试。"
    record = pb.MessageRecord(
        message_id="4",
        conversation_id="1",
        role=pb.MESSAGE_ROLE_ASSISTANT,
        blocks_json=json.dumps([{"type": "text", "text": "订单88235的金额是"}]).encode(),
        status=pb.MESSAGE_STATUS_ERROR,
        metadata_json=json.dumps({"error": sentence}, ensure_ascii=False).encode(),
    )
    view = record_view(record)
    assert view["error"] and view["partial"]
    assert view["error_text"] == sentence
    assert view["items"] == [{"kind": "text", "text": "订单88235的金额是"}]
    # Nothing streamed before the failure: no partial answer, the sentence still shown.
    empty = record_view(
        pb.MessageRecord(
            message_id="5",
            role=pb.MESSAGE_ROLE_ASSISTANT,
            blocks_json=b"[]",
            status=pb.MESSAGE_STATUS_ERROR,
            metadata_json=json.dumps({"error": sentence}).encode(),
        )
    )
    assert (empty["partial"], empty["error_text"], empty["items"]) == (False, sentence, [])


def _get(url: str, headers: dict[str, str]) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_console_is_the_trusted_proxy_of_an_agent_in_proxy_mode(
    state_process_address: str,
) -> None:
    """As in k8s: the agent in AGENT_AUTH_MODE=proxy believes the console's user only with
    the shared secret (CONSOLE_AGENT_PROXY_SECRET); without it the page is told that the
    console is not trusted (the user is signed in: telling them to sign in would be wrong)."""
    from agentstate.dev.processes import ServiceProcess

    secret = "s" * 40
    agent = ServiceProcess(
        "agentstate.agent_service",
        {
            "AGENT_LISTEN_ADDRESS": "127.0.0.1:0",
            "AGENT_AUTH_MODE": "proxy",
            "AGENT_PROXY_SECRET": secret,
            "AGENT_STATE_ADDRESS": state_process_address,
            "AGENT_PROFILE": "order_demo",
            "ORDERS_DATABASE_URL": "",
        },
    )
    consoles: list[ServiceProcess] = []
    try:
        agent_address = agent.wait_ready()
        urls = []
        for given in (secret, ""):
            console = ServiceProcess(
                "agentstate.console",
                {
                    "CONSOLE_LISTEN_ADDRESS": "127.0.0.1:0",
                    "CONSOLE_AGENT_ADDRESS": agent_address,
                    "CONSOLE_STATE_ADDRESS": state_process_address,
                    "CONSOLE_USER_HEADER": "X-Forwarded-User",
                    "CONSOLE_DEV_USER": "",
                    "CONSOLE_AGENT_PROXY_SECRET": given,
                },
            )
            consoles.append(console)
            urls.append(console.wait_ready())
        user = {"X-Forwarded-User": "proxied-user"}
        assert _get(urls[0] + "/api/conversations", user) == (
            200,
            {"conversations": [], "next_page_token": ""},
        )
        status, refused = _get(urls[1] + "/api/conversations", user)
        assert status == 502 and "CONSOLE_AGENT_PROXY_SECRET" in refused["error"]
        assert "not signed in" not in refused["error"]
        # No user at all: the console's own sentence, not the agent's.
        status, anonymous = _get(urls[0] + "/api/conversations", {})
        assert (status, anonymous["error"]) == (401, app.NOT_SIGNED_IN)
    finally:
        codes = [c.terminate() for c in reversed(consoles)] + [agent.terminate()]
        assert codes == [0] * len(codes), "\n".join(s.output for s in [*consoles, agent])


def test_progress_events_and_model_failures_are_told_in_their_own_words() -> None:
    event = pb.TurnEvent(
        progress=pb.ProgressEvent(attempt=2, attempts=3, elapsed_ms=20500, note="retrying")
    )
    assert event_view(event) == {
        "type": "progress",
        "attempt": 2,
        "attempts": 3,
        "elapsed_ms": 20500,
        "note": "retrying",
    }
    assert app._REASONS["MODEL_FAILED"][1].startswith("The model did not answer")
    assert "unreachable" not in app._REASONS["MODEL_FAILED"][1]
    assert app._REASONS["UNAUTHENTICATED"][1] != app.NOT_SIGNED_IN


def test_the_list_shows_status_and_labels_and_searches_on_the_server(
    state_process_address: str, agent_process_address: str
) -> None:
    """Issue 23: each conversation's status (kept by the state service) and labels; the
    title search and the status filter are ListConversations filters, not the page's."""
    import uuid

    import grpc

    from agentstate.dev.processes import ServiceProcess
    from agentstate.state.v1 import state_service_pb2 as spb
    from agentstate.state.v1 import state_service_pb2_grpc as spb_grpc

    user = f"console-{uuid.uuid4()}"
    with grpc.insecure_channel(state_process_address) as channel:
        stub = spb_grpc.StateServiceStub(channel)
        ids = {}
        for title in ("orders: watch", "orders: strap", "hello"):
            made = stub.CreateConversation(
                spb.CreateConversationRequest(user_id=user, title=title, labels={"team": "shop"})
            )
            ids[title] = made.conversation.conversation_id
        stub.AppendMessage(
            spb.AppendMessageRequest(
                user_id=user,
                conversation_id=ids["orders: strap"],
                message=spb.NewMessage(
                    role=spb.MESSAGE_ROLE_ASSISTANT,
                    blocks_json=b"[]",
                    status=spb.MESSAGE_STATUS_AWAITING_CONFIRM,
                ),
            )
        )
    console = ServiceProcess(
        "agentstate.console",
        {
            "CONSOLE_LISTEN_ADDRESS": "127.0.0.1:0",
            "CONSOLE_AGENT_ADDRESS": agent_process_address,
            "CONSOLE_STATE_ADDRESS": state_process_address,
            "CONSOLE_DEV_USER": user,
        },
    )
    try:
        url = console.wait_ready()
        status, everything = _get(url + "/api/conversations", {})
        assert status == 200, everything
        listed = {c["title"]: c for c in everything["conversations"]}
        assert set(listed) == {"orders: watch", "orders: strap", "hello"}
        assert listed["orders: strap"]["status"] == "AWAITING_CONFIRMATION"
        assert listed["hello"]["status"] == "IDLE"
        assert listed["hello"]["labels"] == {"team": "shop"}
        _, found = _get(url + "/api/conversations?q=orders", {})
        assert sorted(c["title"] for c in found["conversations"]) == [
            "orders: strap",
            "orders: watch",
        ]
        _, waiting = _get(url + "/api/conversations?q=orders&status=AWAITING_CONFIRMATION", {})
        assert [c["title"] for c in waiting["conversations"]] == ["orders: strap"]
    finally:
        assert console.terminate() == 0, console.output
