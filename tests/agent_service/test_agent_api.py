"""The agent API's own types, and the seams that keep protobuf out of the runtime."""

from __future__ import annotations

import ast
from pathlib import Path

import grpc

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2 as spb
from tests.support import paths
from tests.support.agent_harness import Stack, metadata
from tests.support.source_example import QUESTION

ROOT = paths.REPO
AGENT = ROOT / "src" / "agentstate" / "agent_service"


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


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_runtime_knows_no_grpc_nor_protobuf() -> None:
    """Only the state client and the servicer translate protobuf; the runtime, the
    records it speaks and the domain model stay free of it."""
    forbidden = (
        "grpc",
        "google.protobuf",
        "agentstate.state.v1",
        "agentstate.agent.v1",
        "agentstate.state_service",
    )
    modules = [
        *sorted((AGENT / "runtime").glob("*.py")),
        AGENT / "records.py",
        AGENT / "agent_state.py",
        AGENT / "events.py",
        AGENT / "turns.py",
    ]
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            name for name in _imports(path) if name.startswith(forbidden)
        )
        for path in modules
    }
    assert {path: names for path, names in offenders.items() if names} == {}
