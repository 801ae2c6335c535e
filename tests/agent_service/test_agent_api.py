"""The agent API's own types, and the seams that keep protobuf out of the runtime."""

from __future__ import annotations

import json
import subprocess
import sys

import grpc

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2 as spb
from tests.support.agent_harness import Stack, metadata
from tests.support.source_example import QUESTION


async def test_records_and_conversations_in_the_agents_own_types(
    stack: Stack, user_id: str
) -> None:
    client = stack.agents[0][1]
    turn = await client.chat(user_id, "我的订单88235现在什么状态？")
    assert turn.code == grpc.StatusCode.OK, turn.details
    (finish,) = turn.of("finish")
    assert finish.record_status == pb.MESSAGE_STATUS_NORMAL
    assert finish.status == spb.MESSAGE_STATUS_NORMAL  # the deprecated v1 field still set
    cid = turn.meta.conversation_id

    page = await client.stub.ListMessages(
        pb.ListMessagesRequest(conversation_id=cid), metadata=metadata(user_id)
    )
    assert [r.role for r in page.records] == [pb.MESSAGE_ROLE_USER, pb.MESSAGE_ROLE_ASSISTANT]
    assert [r.status for r in page.records] == [pb.MESSAGE_STATUS_NORMAL] * 2
    assert "user_id" not in pb.MessageRecord.DESCRIPTOR.fields_by_name  # not the sidecar's type
    # The deprecated field carries the same records, for v1 callers.
    assert [m.message_id for m in page.messages] == [r.message_id for r in page.records]
    assert [m.blocks_json for m in page.messages] == [r.blocks_json for r in page.records]

    renamed = await client.stub.RenameConversation(
        pb.RenameConversationRequest(conversation_id=cid, title="订单状态"),
        metadata=metadata(user_id),
    )
    assert renamed.renamed.title == "订单状态" == renamed.conversation.title
    listed = await client.stub.ListConversations(
        pb.ListConversationsRequest(), metadata=metadata(user_id)
    )
    assert [(c.conversation_id, c.title) for c in listed.items] == [(cid, "订单状态")]
    assert "user_id" not in pb.Conversation.DESCRIPTOR.fields_by_name

    card = await client.chat(user_id, QUESTION, cid)
    page = await client.stub.ListMessages(
        pb.ListMessagesRequest(conversation_id=cid), metadata=metadata(user_id)
    )
    assert page.records[-1].status == pb.MESSAGE_STATUS_AWAITING_CONFIRM
    assert page.records[-1].message_id == card.card.message_id

    # Newest first, each page token going back in time, to the very first record.
    oldest_first = [r.message_id for r in page.records]
    newest_first: list[str] = []
    token = ""
    while True:
        back = await client.stub.ListMessages(
            pb.ListMessagesRequest(
                conversation_id=cid, page_size=3, page_token=token, newest_first=True
            ),
            metadata=metadata(user_id),
        )
        newest_first += [r.message_id for r in back.records]
        assert [m.message_id for m in back.messages] == [r.message_id for r in back.records]
        token = back.next_page_token
        if not token:
            break
    assert len(oldest_first) > 3 and newest_first == oldest_first[::-1]
    try:
        await client.stub.ListMessages(
            pb.ListMessagesRequest(
                conversation_id=cid, page_token="not-a-token", newest_first=True
            ),
            metadata=metadata(user_id),
        )
        raise AssertionError("a bad page token was accepted")
    except grpc.aio.AioRpcError as error:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert "page_token" in (error.details() or "")


def test_the_runtime_loads_no_grpc_nor_protobuf() -> None:
    """Only the state client and the servicer translate protobuf: importing the runtime,
    the records it speaks and the domain model, in a fresh interpreter, loads neither grpc
    nor protobuf nor a generated stub nor the state service."""
    forbidden = (
        "grpc",
        "google.protobuf",
        "agentstate.state.",
        "agentstate.agent.",
        "agentstate.state_service",
    )
    modules = [
        "agentstate.agent_service.runtime",
        "agentstate.agent_service.records",
        "agentstate.agent_service.agent_state",
        "agentstate.agent_service.events",
        "agentstate.agent_service.turns",
    ]
    loaded = _loaded_after(modules)
    assert set(modules) <= set(loaded)
    assert [m for m in loaded if m == "grpc" or m.startswith(forbidden)] == []
    # The check can fail: the servicer does load them.
    loaded = _loaded_after(["agentstate.agent_service.servicer"])
    assert {"grpc", "google.protobuf", "agentstate.agent.v1.agent_service_pb2"} <= set(loaded)


def _loaded_after(modules: list[str]) -> list[str]:
    """sys.modules after importing `modules` in a new interpreter."""
    code = "import json, sys\n" + "".join(f"import {m}\n" for m in modules)
    code += "print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded: list[str] = json.loads(done.stdout)
    return loaded
