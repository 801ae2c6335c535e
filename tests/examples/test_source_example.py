"""The source's worked example, end to end: real gRPC, real services, real PostgreSQL."""

from __future__ import annotations

import json
from decimal import Decimal

import grpc

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent_service.agent_state import PERMISSION_DENIED_TEXT
from agentstate.examples.order_demo.orders.base import OrderStatus
from agentstate.state.v1 import state_service_pb2 as spb
from tests.support.agent_harness import Stack, block_summary
from tests.support.source_example import QUESTION

EXPECTED_CONTEXT = [
    ("USER", ["text"]),
    ("ASSISTANT", ["thinking", "text", "tool_use load_skill allowed"]),
    ("TOOL", ["tool_result load_skill success"]),
    ("ASSISTANT", ["thinking", "tool_use query_order allowed"]),
    ("TOOL", ["tool_result query_order success"]),
    ("ASSISTANT", ["thinking", "text", "tool_use cancel_order asking"]),
    ("TOOL", ["tool_result cancel_order denied"]),
    ("ASSISTANT", ["thinking", "text"]),
]


async def _stock(stack: Stack, user_id: str) -> dict[str, int]:
    order = await stack.orders.get_order(user_id, "88235")
    return {item.sku: await stack.orders.stock(item.sku) for item in order.items}


async def test_the_card_then_deny(stack: Stack, user_id: str) -> None:
    client = stack.agents[0][1]
    first = await client.chat(user_id, QUESTION)
    assert first.code == grpc.StatusCode.OK, first.details
    kinds = first.kinds()
    assert kinds[0] == "meta" and kinds[-2:] == ["confirm", "done"]
    assert "finish" not in kinds and "cancel" not in kinds
    conversation_id = first.meta.conversation_id
    assert first.meta.new_conversation and first.meta.task_id
    card = first.card
    assert [c.tool_name for c in card.calls] == ["cancel_order"]
    assert json.loads(card.calls[0].arguments_json) == {"orderNo": "88235"}
    assert [(f.label, f.value) for f in card.calls[0].display_fields] == [("订单号", "88235")]
    tools_run = [(b.tool_name, b.status) for b in first.of("block")]
    assert tools_run == [
        ("load_skill", pb.TOOL_CALL_STATUS_RUNNING),
        ("load_skill", pb.TOOL_CALL_STATUS_SUCCEEDED),
        ("query_order", pb.TOOL_CALL_STATUS_RUNNING),
        ("query_order", pb.TOOL_CALL_STATUS_SUCCEEDED),
        ("cancel_order", pb.TOOL_CALL_STATUS_ASKING),
    ]
    stock_before = await _stock(stack, user_id)
    records = await stack.reader.records(user_id, conversation_id)
    assert [r.status for r in records] == [
        spb.MESSAGE_STATUS_NORMAL,
        spb.MESSAGE_STATUS_AWAITING_CONFIRM,
    ]
    assert records[1].message_id == card.message_id

    # The user presses Cancel: the request carries only the ids and the decision.
    second = await client.confirm(user_id, conversation_id, card.message_id, approved=False)
    assert second.code == grpc.StatusCode.OK, second.details
    assert second.kinds()[0] == "meta" and second.kinds()[-2:] == ["finish", "done"]
    assert [(b.tool_name, b.status) for b in second.of("block")] == [
        ("cancel_order", pb.TOOL_CALL_STATUS_DENIED)
    ]
    reply = second.reply
    assert "没有执行" in reply and "确认卡片上点了「取消」" in reply
    assert "订单88235目前还是已支付待发货状态" in reply
    for consequence in ("两件商品一起取消", "Apple Watch Series 12", "运动表带", "库存回补"):
        assert consequence in reply
    assert "用掉的券退回" in reply and "已支付的3378.00原路退款" in reply
    assert "权限" not in reply

    # The stored state holds exactly the source's 8 messages.
    state, version = await stack.reader.state(user_id, conversation_id)
    assert version == 2
    assert block_summary(state) == EXPECTED_CONTEXT
    raw = await stack.reader.raw_state(user_id, conversation_id)
    assert sorted(raw) == sorted(
        [
            "session_id",
            "user_id",
            "context",
            "summary",
            "reply_id",
            "cur_iter",
            "shutdown_interrupted",
            "permission_context",
            "tool_context",
            "tasks_context",
            "plan_mode_context",
        ]
    )
    assert raw["session_id"] == conversation_id and raw["user_id"] == user_id
    denied = raw["context"][6]["content"][0]
    asking = raw["context"][5]["content"][2]
    assert denied["id"] == asking["id"] and asking["input"] == {"orderNo": "88235"}
    assert denied["output"] == [{"type": "text", "text": PERMISSION_DENIED_TEXT}]
    assert raw["context"][0]["content"] == [{"type": "text", "text": QUESTION}]
    assert not state.pending_calls()

    # The order is untouched.
    order = await stack.orders.get_order(user_id, "88235")
    assert order.status is OrderStatus.PAID_AWAITING_SHIPMENT
    assert await _stock(stack, user_id) == stock_before
    assert await stack.orders.refunds(user_id, "88235") == []

    # The UI records: question, the settled card, the reply.
    records = await stack.reader.records(user_id, conversation_id)
    assert [r.role for r in records] == [
        spb.MESSAGE_ROLE_USER,
        spb.MESSAGE_ROLE_ASSISTANT,
        spb.MESSAGE_ROLE_ASSISTANT,
    ]
    assert all(r.status == spb.MESSAGE_STATUS_NORMAL for r in records)
    assert json.loads(records[1].metadata_json)["card"]["status"] == "denied"
    reply_blocks = json.loads(records[2].blocks_json)
    assert reply_blocks[0]["type"] == "tool_result" and reply_blocks[0]["state"] == "denied"
    assert second.of("finish")[0].message_id == records[2].message_id


async def test_the_card_then_approve(stack: Stack, user_id: str) -> None:
    client = stack.agents[0][1]
    first = await client.chat(user_id, QUESTION)
    conversation_id = first.meta.conversation_id
    stock_before = await _stock(stack, user_id)
    second = await client.confirm(user_id, conversation_id, first.card.message_id, approved=True)
    assert second.code == grpc.StatusCode.OK, second.details
    assert [(b.tool_name, b.status) for b in second.of("block")] == [
        ("cancel_order", pb.TOOL_CALL_STATUS_RUNNING),
        ("cancel_order", pb.TOOL_CALL_STATUS_SUCCEEDED),
    ]
    assert "已经帮你取消了" in second.reply and "3378.00" in second.reply
    order = await stack.orders.get_order(user_id, "88235")
    assert order.status is OrderStatus.CANCELLED
    assert await _stock(stack, user_id) == {sku: n + 1 for sku, n in stock_before.items()}
    assert await stack.orders.coupon_status(user_id, order.coupon_id) == "AVAILABLE"
    assert await stack.orders.refunds(user_id, "88235") == [Decimal("3378.00")]
    state, _ = await stack.reader.state(user_id, conversation_id)
    assert block_summary(state)[6] == ("TOOL", ["tool_result cancel_order success"])
    assert len(state.context) == 8
