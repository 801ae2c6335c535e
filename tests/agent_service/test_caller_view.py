"""What a caller and a page read (issue 14): error texts without internals, the right
refusal for each wrong request, the paging rule, and each tool call's outcome in the
message records."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent_service.agent_state import PERMISSION_DENIED_TEXT, ToolResultBlock
from agentstate.agent_service.runtime import texts
from agentstate.common import error_details
from agentstate.state_service import domain as d
from tests.support.agent_harness import RecordingModel, Stack, collect, metadata
from tests.support.source_example import QUESTION

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def _calls(record: Any) -> list[tuple[str, str | None, str | None]]:
    return [
        (b["name"], b.get("outcome"), b.get("outcome_text"))
        for b in json.loads(record.blocks_json)
        if b["type"] == "tool_use"
    ]


@pytest.mark.parametrize("approved", [True, False], ids=["approved", "declined"])
async def test_records_carry_each_calls_outcome(stack: Stack, user_id: str, approved: bool) -> None:
    client = stack.agents[0][1]
    first = await client.chat(user_id, QUESTION)
    conversation_id, card_id = first.meta.conversation_id, first.card.message_id
    card_record = (await stack.reader.records(user_id, conversation_id))[1]
    # While the card waits, its call has no outcome; the calls that ran have one
    # (they used to stay "pending" forever).
    assert _calls(card_record) == [
        ("load_skill", "finished", texts.OUTCOME_FINISHED),
        ("query_order", "finished", texts.OUTCOME_FINISHED),
        ("cancel_order", None, None),
    ]
    states = [b["state"] for b in json.loads(card_record.blocks_json) if b["type"] == "tool_use"]
    assert states == ["allowed", "allowed", "asking"]

    turn = await client.confirm(user_id, conversation_id, card_id, approved=approved)
    assert turn.code == grpc.StatusCode.OK, turn.details
    records = await stack.reader.records(user_id, conversation_id)
    expected = (
        ("finished", texts.OUTCOME_FINISHED)
        if approved
        else (
            "declined",
            texts.OUTCOME_DECLINED,
        )
    )
    assert _calls(records[1])[-1] == ("cancel_order", *expected)
    assert json.loads(records[1].metadata_json)["card"]["status"] == (
        "approved" if approved else "denied"
    )
    # The reply's tool_result is in the page's words; the state keeps the source's.
    [result] = [b for b in json.loads(records[2].blocks_json) if b["type"] == "tool_result"]
    page_text = result["output"][0]["text"]
    assert PERMISSION_DENIED_TEXT not in json.dumps(records[2].blocks_json.decode())
    state, _ = await stack.reader.state(user_id, conversation_id)
    [stored] = [
        b
        for m in state.context
        for b in m.content
        if isinstance(b, ToolResultBlock) and b.name == "cancel_order"
    ]
    if approved:
        assert page_text == stored.text
    else:
        assert page_text == texts.OUTCOME_DECLINED
        assert stored.text == PERMISSION_DENIED_TEXT
        # The state is untouched by the record's outcome fields.
        assert "outcome" not in json.dumps(await stack.reader.raw_state(user_id, conversation_id))


async def test_confirm_on_a_message_that_is_not_a_card(stack: Stack, user_id: str) -> None:
    client = stack.agents[0][1]
    first = await client.chat(user_id, "我的订单88235现在什么状态？")
    conversation_id = first.meta.conversation_id
    question, reply = await stack.reader.records(user_id, conversation_id)
    for record in (question, reply):
        turn = await client.confirm(user_id, conversation_id, record.message_id, approved=True)
        assert turn.code == INVALID, turn.details
        assert turn.details == (
            f"message {record.message_id} is not a confirmation card; Confirm answers only cards"
        )
        assert turn.error_info.reason == "NOT_A_CARD"
    # A real card answered twice is still "already handled".
    carded = await client.chat(user_id, QUESTION)
    cid, card_id = carded.meta.conversation_id, carded.card.message_id
    await client.confirm(user_id, cid, card_id, approved=False)
    again = await client.confirm(user_id, cid, card_id, approved=False)
    assert again.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "already handled" in again.details


async def test_error_texts_name_no_internal_field_or_host(stack: Stack, user_id: str) -> None:
    client = stack.agents[0][1]
    bad = await client.confirm(user_id, "123", "abc", approved=True)
    assert bad.code == INVALID
    assert bad.details == "message_id 'abc' is not a valid id"
    bad = await client.confirm(user_id, "x1", "123", approved=True)
    assert bad.details == "conversation_id 'x1' is not a valid id"

    slow = await stack.start_agent(
        model=RecordingModel(delay=1.0), replica_name="vm-7f3a.internal-12"
    )
    call = slow.stub.Chat(pb.ChatRequest(question="你好"), metadata=metadata(user_id))
    conversation_id = (await call.read()).event.meta.conversation_id
    busy = await client.chat(user_id, "你好", conversation_id)
    assert busy.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "has a running turn" in busy.details
    assert "vm-7f3a" not in busy.details
    assert busy.error_info.metadata["holder"] == "vm-7f3a.internal-12"  # for operators
    assert (await collect(call)).code == grpc.StatusCode.OK


async def test_delete_one_conversation_without_an_id(stack: Stack, user_id: str) -> None:
    client = stack.agents[0][1]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.stub.DeleteConversation(
            pb.DeleteConversationRequest(conversation_id=""), metadata=metadata(user_id)
        )
    assert refused.value.code() == INVALID
    assert refused.value.details() == "conversation_id is required"
    with pytest.raises(grpc.aio.AioRpcError) as batch:
        await client.stub.BatchDeleteConversations(
            pb.BatchDeleteConversationsRequest(conversation_ids=[""]), metadata=metadata(user_id)
        )
    assert "conversation_ids[0] is required" in (batch.value.details() or "")


async def test_one_paging_rule_for_every_list(stack: Stack, user_id: str) -> None:
    """0 is the default, above the maximum is the maximum, negative is refused."""
    client = stack.agents[0][1]
    turn = await client.chat(user_id, "我的订单88235现在什么状态？")
    conversation_id = turn.meta.conversation_id
    md = metadata(user_id)
    calls: dict[str, Callable[[int], Awaitable[Any]]] = {
        "ListConversations": lambda n: client.stub.ListConversations(
            pb.ListConversationsRequest(page_size=n), metadata=md
        ),
        "ListMessages": lambda n: client.stub.ListMessages(
            pb.ListMessagesRequest(conversation_id=conversation_id, page_size=n), metadata=md
        ),
        "GetRagHistory": lambda n: client.stub.GetRagHistory(
            pb.GetRagHistoryRequest(conversation_id=conversation_id, turns=n), metadata=md
        ),
    }
    for name, call in calls.items():
        assert await call(0) == await call(100_000), name
        with pytest.raises(grpc.aio.AioRpcError) as negative:
            await call(-1)
        assert negative.value.code() == INVALID, name
        assert "must not be negative" in (negative.value.details() or ""), name
    assert d.page_size(501, default=50, maximum=500) == 500
    info = error_details.error_info(negative.value)
    assert info is not None and info.reason == "INVALID_ARGUMENT"
