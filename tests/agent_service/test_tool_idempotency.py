"""Tools' idempotency keys with a provider that repeats tool-call ids (issue 27, item 1).

Some OpenAI-compatible servers send the same tool-call id in every response. The runtime
hands each tool an idempotency key made of what the service owns (the conversation, the
stored assistant message, the block's position in it), so a repeated id can neither
replay another call's outcome nor be refused as reused; and it stores unique call ids, so
a card whose call repeats an earlier id is still answerable. The agent talks to a local
OpenAI-compatible HTTP server with the real SDK, the state service and the order system
run on the test PostgreSQL.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from agentstate.agent_service.agent_state import AgentState, ToolResultBlock, ToolUseBlock
from agentstate.agent_service.model.base import ToolSpec
from agentstate.agent_service.model.openai_compat import OpenAICompatModel
from agentstate.agent_service.tools.registry import Permission, Tool, ToolContext, ToolOutput
from agentstate.examples.order_demo.orders.base import OrderStatus
from tests.agent_service.test_openai_compat import (
    FakeChatServer,
    Reply,
    chunk,
    settings_for,
    text_stream,
    tool_call_args,
    tool_call_start,
)
from tests.support.agent_harness import AgentClient, Stack

# The ids a careless provider sends, the same in every response.
SKILL_CALL_ID = "call_fake_skill"
QUERY_CALL_ID = "call_fake_query"
CANCEL_CALL_ID = "call_fake_cancel"


def tool_call(call_id: str, name: str, arguments: str) -> Reply:
    return Reply(
        events=[
            chunk({"role": "assistant", "content": None}),
            chunk(tool_call_start(0, call_id, name)),
            chunk(tool_call_args(0, arguments)),
            chunk({}, "tool_calls"),
            "[DONE]",
        ]
    )


def load_handbook() -> Reply:
    return tool_call(SKILL_CALL_ID, "load_skill", '{"name": "order-change"}')


def query_orders() -> Reply:
    return tool_call(QUERY_CALL_ID, "query_order", '{"limit": 5}')


def cancel(order_no: str) -> Reply:
    return tool_call(CANCEL_CALL_ID, "cancel_order", f'{{"orderNo": "{order_no}"}}')


@pytest.fixture
async def agent(stack: Stack, server: FakeChatServer) -> AsyncIterator[AgentClient]:
    model = OpenAICompatModel(settings_for(server.base_url))
    yield await stack.start_agent(model=model)
    await model.aclose()


def cancel_result(state: AgentState) -> ToolResultBlock:
    results = [
        block
        for msg in state.context
        for block in msg.content
        if isinstance(block, ToolResultBlock) and block.name == "cancel_order"
    ]
    return results[-1]


async def cancel_in_a_new_conversation(
    stack: Stack, server: FakeChatServer, agent: AgentClient, user_id: str, order_no: str
) -> ToolResultBlock:
    """Ask, get the card, approve it; the cancel_order result the state keeps."""
    server.script(load_handbook(), query_orders(), cancel(order_no))
    card = await agent.chat(user_id, f"帮我取消订单{order_no}")
    assert card.code == grpc.StatusCode.OK, card.details
    conversation_id = card.meta.conversation_id
    server.script(text_stream("好的。"))
    approved = await agent.confirm(user_id, conversation_id, card.card.message_id, approved=True)
    assert approved.code == grpc.StatusCode.OK, approved.details
    state, _ = await stack.reader.state(user_id, conversation_id)
    return cancel_result(state)


async def test_a_repeated_call_id_never_reaches_another_conversations_outcome(
    stack: Stack,
    server: FakeChatServer,
    agent: AgentClient,
    user_id: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR):
        first = await cancel_in_a_new_conversation(stack, server, agent, user_id, "88235")
        # Another order under the same provider id: cancelled, not "key already used".
        second = await cancel_in_a_new_conversation(stack, server, agent, user_id, "88240")
        # The first order again, elsewhere: the order system's truth, not a replay of
        # the first conversation's "已取消" as if it had just happened.
        third = await cancel_in_a_new_conversation(stack, server, agent, user_id, "88235")

    assert first.state.value == "success", first.text
    assert first.text.startswith("订单 88235 已取消。"), first.text
    assert second.state.value == "success", second.text
    assert second.text.startswith("订单 88240 已取消。"), second.text
    assert third.state.value == "error", third.text
    assert third.text == (
        "订单 88235 未取消：订单 88235 当前状态为已取消，只有已支付待发货的订单可以取消"
    )
    assert [r.getMessage() for r in caplog.records] == []
    for order_no in ("88235", "88240"):
        order = await stack.orders.get_order(user_id, order_no)
        assert order is not None and order.status is OrderStatus.CANCELLED
        assert len(await stack.orders.refunds(user_id, order_no)) == 1


async def test_a_card_whose_call_repeats_an_earlier_id_is_answerable(
    stack: Stack, server: FakeChatServer, agent: AgentClient, user_id: str
) -> None:
    """Within one conversation: the second card's call id equals the first's, and the
    first already has its result. The stored ids are unique, so the card stays open."""
    server.script(load_handbook(), query_orders(), cancel("88235"))
    card = await agent.chat(user_id, "帮我取消订单88235")
    conversation_id = card.meta.conversation_id
    server.script(text_stream("已取消。"))
    turn = await agent.confirm(user_id, conversation_id, card.card.message_id, approved=True)
    assert turn.code == grpc.StatusCode.OK, turn.details

    server.script(cancel("88240"))  # the handbook is still in context
    again = await agent.chat(user_id, "88240 也取消", conversation_id)
    assert again.code == grpc.StatusCode.OK, again.details
    assert again.kinds().count("confirm") == 1
    server.script(text_stream("也取消了。"))
    answered = await agent.confirm(user_id, conversation_id, again.card.message_id, approved=True)
    assert answered.code == grpc.StatusCode.OK, answered.details

    state, _ = await stack.reader.state(user_id, conversation_id)
    assert not state.pending_calls()
    assert cancel_result(state).text.startswith("订单 88240 已取消。")
    uses = [b.id for m in state.context for b in m.content if isinstance(b, ToolUseBlock)]
    assert len(uses) == 4 and len(set(uses)) == 4, uses
    # The provider's ids while they are unique; the repeated one replaced.
    assert uses[:3] == [SKILL_CALL_ID, QUERY_CALL_ID, CANCEL_CALL_ID]
    # What the provider was sent back pairs each result with its own call.
    sent = server.received[-1].body["messages"]
    call_ids = [c["id"] for m in sent if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    result_ids = [m["tool_call_id"] for m in sent if m["role"] == "tool"]
    assert call_ids == result_ids == uses


async def test_a_retried_call_gets_the_same_key_and_nothing_else_does(
    database_url: str, orders_database_url: str, server: FakeChatServer, user_id: str
) -> None:
    """A call cut off by a shutdown runs again on the next replica under the same key;
    the same provider id in another conversation gets another key."""
    keys: list[tuple[str, str]] = []  # (provider call id, idempotency key)
    started = asyncio.Event()

    async def refund(args: dict[str, Any], context: ToolContext) -> ToolOutput:
        keys.append((context.call_id, context.idempotency_key))
        started.set()
        if len(keys) == 1:
            await asyncio.sleep(60)  # the first attempt hangs until it is cancelled
        return ToolOutput("退款已登记。")

    tool = Tool(
        spec=ToolSpec("refund", "登记一笔退款", {"type": "object", "properties": {}}),
        run=refund,
        permission=Permission.ASK,
    )
    stack = Stack(database_url, orders_database_url, shutdown_grace_seconds=0.2)
    model = OpenAICompatModel(settings_for(server.base_url))
    await stack.start_state()
    try:
        replica = await stack.start_agent(model=model, extra_tools=[tool])
        server.script(tool_call("call_same", "refund", "{}"))
        card = await replica.chat(user_id, "退款")
        conversation_id, card_id = card.meta.conversation_id, card.card.message_id
        confirm = asyncio.ensure_future(replica.confirm(user_id, conversation_id, card_id, True))
        await asyncio.wait_for(started.wait(), 10)
        await stack.stop_agent(replica)  # the hung call is cancelled
        confirm.cancel()

        replica = await stack.start_agent(model=model, extra_tools=[tool])
        server.script(text_stream("已登记。"))
        retried = await replica.confirm(user_id, conversation_id, card_id, approved=True)
        assert retried.code == grpc.StatusCode.OK, retried.details

        server.script(tool_call("call_same", "refund", "{}"), text_stream("已登记。"))
        other = await replica.chat(user_id, "退款")
        other_id = other.meta.conversation_id
        await replica.confirm(user_id, other_id, other.card.message_id, approved=True)
    finally:
        await stack.close()
        await model.aclose()

    assert [call_id for call_id, _ in keys] == ["call_same"] * 3
    assert keys[0][1] == keys[1][1]  # the retry: the same key
    assert keys[2][1] != keys[0][1]  # another conversation: another key
    assert conversation_id in keys[0][1] and other_id in keys[2][1]
