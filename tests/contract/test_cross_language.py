"""The contract used from another language: Node.js grpc-js clients against the real services.

The clients (tests/contract/node/*.mjs) load the .proto files from protos/ at run time with
@grpc/proto-loader, so nothing generated from Python is involved. Node and the packages in
tools/node_modules (`npm ci` in tools/, done by `./run setup`) are required: without them these
tests fail rather than skip, because CI installs them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from typing import Any

import grpc
import pytest

from agentstate.state.v1 import state_service_pb2 as spb
from agentstate.state.v1 import state_service_pb2_grpc as spb_grpc
from tests.support import paths
from tests.support.source_example import QUESTION

ROOT = paths.REPO
NODE_DIR = paths.TESTS / "contract" / "node"
TOOLS_MODULES = ROOT / "tools" / "node_modules"
REQUIRED_PACKAGES = ("@grpc/grpc-js", "@grpc/proto-loader")


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: the cross-language tests need Node.js 20+", pytrace=False)
    missing = [p for p in REQUIRED_PACKAGES if not (TOOLS_MODULES / p / "package.json").is_file()]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} missing under {TOOLS_MODULES}: run `npm ci` in tools/ "
            "(./run setup does it)",
            pytrace=False,
        )
    return node


def run_node(script: str, *args: str) -> dict[str, Any]:
    """Runs a Node client; returns the JSON object it printed, failing on a non-zero exit."""
    proc = subprocess.run(
        [_node(), str(NODE_DIR / script), *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
        check=False,
    )
    report = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    lines = proc.stdout.strip().splitlines()
    assert lines, report
    result: dict[str, Any] = json.loads(lines[-1])
    assert result["failures"] == [], report
    return result


def test_node_client_uses_the_state_service(state_process_address: str, user_id: str) -> None:
    out = run_node("state_client.mjs", state_process_address, user_id)

    conversation_id = out["conversation"]["conversation_id"]
    assert conversation_id.isdigit() and 0 < int(conversation_id) < 2**63
    assert out["conversation"]["user_id"] == user_id
    assert out["conversation"]["title"] == "跨语言测试"
    # int64 arrives in JavaScript as a decimal string (longs: String), never a lossy Number.
    assert out["create_upsert"]["version"] == "1"
    assert out["create_upsert"]["version_type"] == "string"
    assert [m["status"] for m in out["create_upsert"]["messages"]] == ["MESSAGE_STATUS_NORMAL"]

    # The UTF-8 JSON payload (Chinese text included) round-tripped as the same JSON value.
    state = out["get_state"]
    assert state["payload_equal"] is True and state["payload_is_buffer"] is True
    assert state["payload"]["greeting"] == "你好，世界"
    assert state["payload"]["note"] == QUESTION
    assert state["version"] == "1"
    assert out["cas_upsert"]["version"] == "2"

    # Compare-and-set failures are ABORTED with the current version in the trailing metadata.
    assert out["stale_upsert"]["code"] == "ABORTED"
    assert out["stale_upsert"]["current_version"] == "2"
    assert "current version is 2" in out["stale_upsert"]["details"]
    assert out["create_only_again"] == {"code": "ABORTED", "current_version": "2"}

    # Another user's conversation does not exist for them.
    assert out["other_user_get"]["code"] == "NOT_FOUND"
    assert out["other_user_get"]["missing"] == "conversation"

    (record,) = out["list_messages"]["messages"]
    assert record["message_id"] == out["create_upsert"]["messages"][0]["message_id"]
    assert record["conversation_id"] == conversation_id
    assert (record["role"], record["status"]) == ("MESSAGE_ROLE_USER", "MESSAGE_STATUS_NORMAL")
    assert record["blocks"] == [{"type": "text", "text": "帮我取消订单 88235"}]
    assert record["metadata"] == {"source": "grpc-js"}

    assert out["delete"] == {
        "conversations_deleted": "1",
        "messages_deleted": "1",
        "states_deleted": "1",
    }
    assert out["get_after_delete"] == {"code": "NOT_FOUND", "missing": "conversation"}

    # The Python client sees what the Node client did: nothing left.
    with grpc.insecure_channel(state_process_address) as channel:
        listed = spb_grpc.StateServiceStub(channel).ListConversations(
            spb.ListConversationsRequest(user_id=user_id), timeout=10
        )
    assert list(listed.conversations) == []


def test_node_client_chats_and_declines_the_card(
    state_process_address: str, agent_process_address: str
) -> None:
    user_id = f"node-{uuid.uuid4()}"
    out = run_node("agent_client.mjs", agent_process_address, user_id, QUESTION)

    chat = out["chat"]
    assert chat["code"] == "OK", chat
    assert chat["kinds"][0] == "meta"
    assert chat["kinds"][-2:] == ["confirm", "done"], chat["kinds"]
    assert chat["meta"]["new_conversation"] is True
    card = chat["card"]
    assert card is not None and card["message_id"].isdigit()
    assert [c["tool_name"] for c in card["calls"]] == ["cancel_order"]
    assert card["calls"][0]["arguments"] == {"orderNo": "88235"}

    confirm = out["confirm"]
    assert confirm is not None and confirm["code"] == "OK", confirm
    assert confirm["kinds"][0] == "meta"
    assert confirm["kinds"][-2:] == ["finish", "done"], confirm["kinds"]
    assert confirm["meta"]["conversation_id"] == out["conversation_id"]
    assert [b["status"] for b in confirm["blocks"]] == ["TOOL_CALL_STATUS_DENIED"]
    assert confirm["finish"]["status"] == "MESSAGE_STATUS_NORMAL"
    reply = confirm["reply"]
    for expected in ("88235", "已支付待发货", "3378.00"):
        assert expected in reply, reply

    # What the Node client caused is what the state service stored.
    with grpc.insecure_channel(state_process_address) as channel:
        records = (
            spb_grpc.StateServiceStub(channel)
            .ListMessages(
                spb.ListMessagesRequest(user_id=user_id, conversation_id=out["conversation_id"]),
                timeout=10,
            )
            .messages
        )
    ids = [r.message_id for r in records]
    assert card["message_id"] in ids
    assert ids[-1] == confirm["finish"]["message_id"]
    assert records[-1].status == spb.MESSAGE_STATUS_NORMAL
