"""The order demo's scripted model: the offline default of the order_demo profile.

It follows the order-change handbook the way a real model would, from what is
in its context: it loads the handbook if it is not there, queries the recent
orders if this turn has not, finds the order the user means (by its number, or
by a product it contains), asks to cancel it, and answers a decision on the
card using only the stored tool results (the orders and the handbook's step 3),
never canned facts. The generic parts (slash commands, remembered facts,
summaries) are agent_service.model.scripted's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentstate.agent_service.agent_state import Role, ToolResultState, ToolUseBlock
from agentstate.agent_service.model.scripted import ScriptedModel, ScriptedView, Step
from agentstate.examples.order_demo.orders.base import MAX_RECENT_ORDERS
from agentstate.examples.order_demo.tools import ORDER_SKILL

AWAITING_SHIPMENT = "已支付待发货"
RECENT = 5  # how many orders the first query asks for, as in the source
_ORDER_LINE = re.compile(
    r"订单 (?P<no>\d+) \| (?P<status>\S+) \| 实付 (?P<paid>[\d.]+) \| "
    r"下单 (?P<placed>[\d-]+ [\d:]+)\n\s+商品: (?P<items>[^\n]+)"
)
# An order number in the user's words: five digits or more (a year or an amount is not
# one: 2026, 3378.00).
_ORDER_NO = re.compile(r"(?<![\d.])\d{5,}(?!\d|\.\d)")
_CANCEL_WORDS = ("取消", "不要了", "不想要", "cancel")
ASK_FOR_NUMBER = "能告诉我订单号吗？"
_CN_NUMBERS = "零一两三四五六七八九十"


@dataclass(frozen=True)
class _Order:
    no: str
    status: str
    paid: str
    placed: str
    items: list[str]


def _parse_orders(text: str) -> list[_Order]:
    return [
        _Order(
            no=m["no"],
            status=m["status"],
            paid=m["paid"],
            placed=m["placed"],
            items=[item.strip() for item in m["items"].split("、") if item.strip()],
        )
        for m in _ORDER_LINE.finditer(text)
    ]


def _item_name(item: str) -> str:
    return re.sub(r"\s*×\d+$", "", item)


def _mentions(question: str, order: _Order) -> bool:
    """Does the question name one of the order's products?"""
    asked = question.lower()
    for item in order.items:
        name = _item_name(item).lower()
        words = name.split()
        keys = {name, " ".join(words[:2])} if len(words) > 1 else {name}
        if any(key and key in asked for key in keys):
            return True
    return False


def order_numbers(question: str) -> list[str]:
    """The order numbers the user wrote, in order."""
    return _ORDER_NO.findall(question)


def wants_cancel(question: str) -> bool:
    lowered = question.lower()
    return any(word in lowered for word in _CANCEL_WORDS)


def _count_cn(n: int) -> str:
    return _CN_NUMBERS[n] if 0 <= n < len(_CN_NUMBERS) else str(n)


def _answers_our_question(view: ScriptedView) -> bool:
    """Did the previous turn end by asking the user for the order number?"""
    for msg in reversed(view.context[: view.turn_start]):
        if msg.role is Role.ASSISTANT and msg.text:
            return msg.text.endswith(ASK_FOR_NUMBER)
    return False


def _handbook(view: ScriptedView) -> str:
    """The order-change handbook's text, while it is in the context untrimmed."""
    for result in view.results("load_skill"):
        if result.state is ToolResultState.SUCCESS and "订单变更" in result.text:
            return result.text
    return ""


def _handbook_step(view: ScriptedView, number: int) -> str:
    match = re.search(rf"^{number}\.\s*(.+)$", _handbook(view), re.MULTILINE)
    return match.group(1).strip() if match else ""


class ScriptedOrderModel(ScriptedModel):
    name = "scripted-order-model"
    greeting = "你好，我可以帮你查询订单，或取消还没发货的订单。"

    def answer(self, view: ScriptedView) -> Step:
        question = view.question
        numbers = order_numbers(question)
        # "88240" alone, after we asked which order: still the cancellation asked for.
        cancel = wants_cancel(question) or bool(numbers and _answers_our_question(view))
        if cancel and ("cancel_order" not in view.tools or not _handbook(view)):
            return Step(
                "用户要取消订单，先加载订单变更手册。",
                "我先看一下订单变更的处理规范。",
                ("load_skill", {"name": ORDER_SKILL}),
            )
        queries = view.calls("query_order")
        results = view.results("query_order", this_turn=True)
        if not results:
            return Step(f"先查最近{RECENT}笔订单。", "", ("query_order", {"limit": RECENT}))
        if results[-1].state is not ToolResultState.SUCCESS:
            return Step("查询订单失败。", f"查询订单没有成功：{results[-1].text}")
        orders = _parse_orders(results[-1].text)
        if numbers:
            named = [o for o in orders if o.no in numbers]
            if not named:
                limit = queries[-1].input.get("limit") if queries else None
                asked = limit if isinstance(limit, int) else RECENT
                if len(orders) >= asked and asked < MAX_RECENT_ORDERS:
                    # A full page: the order may be older. Look as far back as the tool allows.
                    return Step(
                        f"最近{asked}笔里没有订单{numbers[0]}，再往前查。",
                        "",
                        ("query_order", {"limit": MAX_RECENT_ORDERS}),
                    )
                return self._unknown_number(numbers[0], orders, complete=len(orders) < asked)
        else:
            named = [o for o in orders if _mentions(question, o)]
        if not cancel:
            return Step(text=self._describe(named or orders))
        if not named:
            return Step(
                "最近的订单里没有用户说的商品。",
                f"最近{len(orders)}笔订单里没有找到你说的商品，{ASK_FOR_NUMBER}",
            )
        order = named[0]
        cancels = [c for c in view.calls("cancel_order") if c.input.get("orderNo") == order.no]
        if cancels:
            return self._after_cancel(view, order, cancels[-1])
        if order.status != AWAITING_SHIPMENT:
            return Step(
                f"{order.no} 的状态是{order.status}，不能取消。",
                f"订单{order.no}目前是{order.status}状态，按规定只有已支付待发货的订单能取消。",
            )
        return Step(
            f"{order.no} {AWAITING_SHIPMENT}，可以取消，需要用户确认。",
            f"找到了订单{order.no}（{'、'.join(order.items)}，实付{order.paid}），"
            "还没发货，我来帮你取消，请在卡片上确认。",
            ("cancel_order", {"orderNo": order.no}),
        )

    def _unknown_number(self, number: str, orders: list[_Order], *, complete: bool) -> Step:
        where = "你的订单里" if complete else f"你最近的{len(orders)}笔订单里"
        known = "、".join(o.no for o in orders)
        listed = f"（{'你的订单' if complete else '这些订单'}是：{known}）" if known else ""
        return Step(
            f"查到的订单里没有{number}。",
            f"{where}没有订单号为{number}的订单{listed}，请核对一下订单号。",
        )

    def _after_cancel(self, view: ScriptedView, order: _Order, call: ToolUseBlock) -> Step:
        result = next((r for r in view.results("cancel_order") if r.id == call.id), None)
        if result is None:
            return Step("取消还在等用户确认。", "取消还在等你在卡片上确认。")
        if result.state is ToolResultState.SUCCESS:
            return Step("取消成功，如实告诉用户结果。", f"已经帮你取消了。{result.text}")
        if result.state is ToolResultState.DENIED:
            if "确认卡片上点了取消" in result.text:
                return Step("用户在确认卡上点了取消，如实说明。", self._denial_reply(view, order))
            # The framework's raw wording reads like missing rights.
            return Step(
                "工具返回权限不足。",
                f"取消订单{order.no}失败：没有权限执行这个操作，可能需要先开通相应权限后再试。",
            )
        if result.state is ToolResultState.INTERRUPTED:
            return Step(text=f"这次取消没有执行：{result.text}订单{order.no}没有变化。")
        return Step(text=f"取消没有成功：{result.text}")

    def _denial_reply(self, view: ScriptedView, order: _Order) -> str:
        lines = [
            f"这次取消没有执行——你在确认卡片上点了「取消」，所以我停下来了，"
            f"订单{order.no}目前还是{order.status}状态。"
        ]
        step = _handbook_step(view, 3)
        consequences = step.split("：", 1)[1].split("、") if "：" in step else []
        if consequences:
            lines.append("如果真要取消，会一起发生这些事：")
            items = "、".join(order.items)
            lines.append(f"- {_count_cn(len(order.items))}件商品一起取消：{items}")
            for consequence in consequences:
                if "退款" in consequence:
                    consequence = consequence.replace("已支付的", f"已支付的{order.paid}")
                lines.append(f"- {consequence}")
        lines.append("需要的话再告诉我，我会重新发起，并请你在卡片上确认。")
        return "\n".join(lines)

    def _describe(self, shown: list[_Order]) -> str:
        parts = [f"订单{o.no}：{o.status}，实付{o.paid}，下单{o.placed}" for o in shown]
        return "；".join(parts) + "。" if parts else "没有找到订单。"
