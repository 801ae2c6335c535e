"""query_order and cancel_order: the agent's window onto the demo order system.

The order system is a separate business backend (examples.order_demo.orders); these
tools only turn its answers into text for the model.
"""

from __future__ import annotations

from typing import Any

from agentstate.agent_service.model.base import ToolSpec
from agentstate.agent_service.tools.registry import Permission, Tool, ToolContext, ToolOutput
from agentstate.examples.order_demo.orders.base import Order, OrderSystem, OrderSystemUnavailable

# The handbook (skills/order-change.md) that cancel_order waits for.
ORDER_SKILL = "order-change"


def format_orders(orders: list[Order]) -> str:
    """The list as the source's query_order returned it (see BRIEF.md)."""
    lines = [f"【最近 {len(orders)} 笔订单】", ""]
    for index, order in enumerate(orders, start=1):
        placed = order.placed_at.strftime("%Y-%m-%d %H:%M")
        lines.append(
            f"{index}. 订单 {order.order_no} | {order.status.label} | "
            f"实付 {order.paid_amount:.2f} | 下单 {placed}"
        )
        items = "、".join(f"{item.name} ×{item.quantity}" for item in order.items)
        lines.append(f"   商品: {items}")
    return "\n".join(lines)


def query_order_tool(orders: OrderSystem) -> Tool:
    async def run(args: dict[str, Any], context: ToolContext) -> ToolOutput:
        try:
            await orders.ensure_seeded(context.user_id)
            found = await orders.recent_orders(context.user_id, int(args["limit"]))
        except OrderSystemUnavailable as exc:
            return ToolOutput(f"订单系统暂时不可用：{exc}", ok=False)
        if not found:
            return ToolOutput("没有找到订单。")
        return ToolOutput(format_orders(found))

    return Tool(
        spec=ToolSpec(
            name="query_order",
            description="查询当前用户最近的订单（订单号、状态、实付金额、下单时间、商品）。",
            parameters={
                "type": "object",
                "properties": {
                    "limit": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 20,
                        "default": 5,
                        "description": "返回几笔，1-20",
                    }
                },
                "additionalProperties": False,
            },
        ),
        run=run,
    )


def cancel_order_tool(orders: OrderSystem) -> Tool:
    async def run(args: dict[str, Any], context: ToolContext) -> ToolOutput:
        order_no = str(args["orderNo"])
        try:
            # The runtime's key for this call: a retry of it replays, nothing else does.
            outcome = await orders.cancel_order(context.user_id, order_no, context.idempotency_key)
        except OrderSystemUnavailable as exc:
            return ToolOutput(f"订单系统暂时不可用，订单 {order_no} 未取消：{exc}", ok=False)
        if not outcome.cancelled:
            return ToolOutput(f"订单 {order_no} 未取消：{outcome.reason}", ok=False)
        parts = [f"订单 {order_no} 已取消。"]
        if outcome.restored_stock:
            parts.append(f"库存已回补 {sum(outcome.restored_stock.values())} 件。")
        if outcome.coupon_returned:
            parts.append(f"优惠券 {outcome.coupon_returned} 已退回。")
        if outcome.refund_amount is not None:
            parts.append(f"实付 {outcome.refund_amount:.2f} 将原路退款。")
        return ToolOutput("".join(parts))

    return Tool(
        spec=ToolSpec(
            name="cancel_order",
            description="取消一笔已支付待发货的订单（需要用户在确认卡片上确认）。",
            parameters={
                "type": "object",
                "properties": {"orderNo": {"type": "string", "description": "订单号"}},
                "required": ["orderNo"],
                "additionalProperties": False,
            },
        ),
        run=run,
        permission=Permission.ASK,
        card_title=lambda args: f"取消订单 {args.get('orderNo', '')}",
        card_fields=lambda args: [("订单号", str(args.get("orderNo", "")))],
        skill=ORDER_SKILL,
    )
