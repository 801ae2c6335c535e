"""The order demo profile (examples/order_demo) through the real agent service: orders
named by number, what it ships, and how it is selected."""

from __future__ import annotations

import json
from decimal import Decimal

import grpc
import pytest

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent_service.profile import load_profile
from agentstate.examples.order_demo import OrderDemoProfile
from agentstate.examples.order_demo.model import order_numbers, wants_cancel
from agentstate.examples.order_demo.orders.base import OrderStatus
from agentstate.examples.order_demo.orders.memory import MemoryOrderSystem
from agentstate.examples.order_demo.orders.postgres import PostgresOrderSystem
from tests.support.agent_harness import Stack, Turn
from tests.support.source_example import HANDBOOK_STEP_3

RUNNING, SUCCEEDED, ASKING = (
    pb.TOOL_CALL_STATUS_RUNNING,
    pb.TOOL_CALL_STATUS_SUCCEEDED,
    pb.TOOL_CALL_STATUS_ASKING,
)


def _tools_run(turn: Turn) -> list[tuple[str, int]]:
    return [(b.tool_name, b.status) for b in turn.of("block")]


def _tool_arguments(turn: Turn, name: str) -> list[dict[str, object]]:
    return [
        json.loads(b.arguments_json)
        for b in turn.of("block")
        if b.tool_name == name and b.status == RUNNING
    ]


@pytest.mark.parametrize("question", ["取消订单88240", "帮我取消88240", "88240那单不要了"])
async def test_a_named_order_goes_straight_to_its_card(
    stack: Stack, user_id: str, question: str
) -> None:
    client = stack.agents[0][1]
    first = await client.chat(user_id, question)
    assert first.code == grpc.StatusCode.OK, first.details
    assert first.kinds()[-2:] == ["confirm", "done"], first.reply
    assert _tools_run(first) == [
        ("load_skill", RUNNING),
        ("load_skill", SUCCEEDED),
        ("query_order", RUNNING),
        ("query_order", SUCCEEDED),
        ("cancel_order", ASKING),
    ]
    [call] = first.card.calls
    assert json.loads(call.arguments_json) == {"orderNo": "88240"}
    assert [(f.label, f.value) for f in call.display_fields] == [("订单号", "88240")]
    assert "能告诉我订单号吗" not in first.reply
    assert "找到了订单88240（USB-C 充电线 ×2，实付129.00）" in first.reply

    # Cancel on the card: the reply is about 88240, from the stored results alone.
    second = await client.confirm(
        user_id, first.meta.conversation_id, first.card.message_id, approved=False
    )
    assert second.code == grpc.StatusCode.OK, second.details
    reply = second.reply
    assert "订单88240目前还是已支付待发货状态" in reply
    assert "一件商品一起取消：USB-C 充电线 ×2" in reply and "已支付的129.00原路退款" in reply
    order = await stack.orders.get_order(user_id, "88240")
    assert order.status is OrderStatus.PAID_AWAITING_SHIPMENT
    assert await stack.orders.refunds(user_id, "88240") == []


async def test_the_number_given_when_asked_for_it(stack: Stack, user_id: str) -> None:
    client = stack.agents[0][1]
    asked = await client.chat(user_id, "帮我取消那副耳机")  # no product of that name
    assert asked.reply.endswith("最近5笔订单里没有找到你说的商品，能告诉我订单号吗？")
    assert asked.kinds()[-2:] == ["finish", "done"]
    answered = await client.chat(user_id, "88240", asked.meta.conversation_id)
    assert answered.kinds()[-2:] == ["confirm", "done"], answered.reply
    # The handbook is still in the context: straight to the query and the card.
    assert _tools_run(answered) == [
        ("query_order", RUNNING),
        ("query_order", SUCCEEDED),
        ("cancel_order", ASKING),
    ]
    assert json.loads(answered.card.calls[0].arguments_json) == {"orderNo": "88240"}
    # Without that question, a bare number is a question about the order.
    other = await client.chat(f"{user_id}-b", "88240")
    assert other.kinds()[-2:] == ["finish", "done"]
    assert other.reply == "订单88240：已支付待发货，实付129.00，下单2026-09-20 09:12。"


async def test_a_named_order_is_cancelled_when_approved(stack: Stack, user_id: str) -> None:
    client = stack.agents[0][1]
    first = await client.chat(user_id, "取消订单88240")
    second = await client.confirm(
        user_id, first.meta.conversation_id, first.card.message_id, approved=True
    )
    assert second.code == grpc.StatusCode.OK, second.details
    assert "已经帮你取消了" in second.reply and "订单 88240 已取消" in second.reply
    assert (await stack.orders.get_order(user_id, "88240")).status is OrderStatus.CANCELLED
    assert await stack.orders.refunds(user_id, "88240") == [Decimal("129.00")]
    # The other order awaiting shipment, the source's, is untouched.
    assert await stack.orders.refunds(user_id, "88235") == []


async def test_a_number_that_is_not_the_users_gets_a_clear_answer(
    stack: Stack, user_id: str
) -> None:
    client = stack.agents[0][1]
    turn = await client.chat(user_id, "取消订单99999")
    assert turn.code == grpc.StatusCode.OK, turn.details
    assert turn.kinds()[-2:] == ["finish", "done"]
    # The five recent orders fill the page, so it looks as far back as the tool allows.
    assert _tool_arguments(turn, "query_order") == [{"limit": 5}, {"limit": 20}]
    assert "cancel_order" not in {name for name, _ in _tools_run(turn)}
    assert turn.reply.endswith(
        "你的订单里没有订单号为99999的订单"
        "（你的订单是：88240、88239、88237、88235、88230），请核对一下订单号。"
    )
    # Another user's order is not the user's either.
    other = f"{user_id}-other"
    await client.chat(other, "我的订单88235现在什么状态？")
    assert (await stack.orders.get_order(other, "88235")) is not None
    status = await client.chat(user_id, "订单12345现在什么状态？")
    assert "没有订单号为12345的订单" in status.reply


async def test_a_named_order_that_cannot_be_cancelled(stack: Stack, user_id: str) -> None:
    turn = await stack.agents[0][1].chat(user_id, "帮我取消88237")
    assert turn.kinds()[-2:] == ["finish", "done"]
    assert "订单88237目前是已发货状态" in turn.reply
    assert "cancel_order" not in {name for name, _ in _tools_run(turn)}


def test_order_numbers_and_cancel_words() -> None:
    assert order_numbers("取消订单88240") == ["88240"]
    assert order_numbers("88240那单不要了，还有88235") == ["88240", "88235"]
    # Neither a date, an amount nor a count is an order number.
    assert order_numbers("2026-09-13下的单，实付3378.00，最近5笔") == []
    assert order_numbers("实付 12345.50 元") == []
    assert all(wants_cancel(q) for q in ["取消订单88240", "88240那单不要了", "不想要了", "Cancel"])
    assert not wants_cancel("我的订单88235现在什么状态？")


def test_the_profile_ships_the_handbook_and_tools() -> None:
    profile = OrderDemoProfile()
    handbook = profile.skills()["order-change"]
    assert f"\n3. {HANDBOOK_STEP_3}\n" in handbook  # step 3 exactly as the source quotes it
    tools = {tool.name: tool for tool in profile.tools()}
    assert sorted(tools) == ["cancel_order", "query_order"]
    assert tools["cancel_order"].permission == "ask" and tools["cancel_order"].skill == (
        "order-change"
    )
    assert tools["query_order"].permission == "allow" and tools["query_order"].skill is None
    assert isinstance(profile.orders, MemoryOrderSystem)
    assert profile.scripted_model().name == "scripted-order-model"


@pytest.mark.parametrize("spec", ["order_demo", "agentstate.examples.order_demo:create_profile"])
def test_selected_by_name_or_module_path(spec: str) -> None:
    profile = load_profile(spec, {"ORDERS_DATABASE_URL": "postgresql://db/orders"})
    assert isinstance(profile, OrderDemoProfile) and profile.name == "order_demo"
    assert isinstance(profile.orders, PostgresOrderSystem)
    in_memory = load_profile(spec, {})
    assert isinstance(in_memory, OrderDemoProfile)
    assert isinstance(in_memory.orders, MemoryOrderSystem)
