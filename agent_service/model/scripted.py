"""A deterministic model for the order domain: the offline default.

It decides every step from what is in the context it is given, the way a real
model would: it loads the handbook if it is not there, queries orders if this
turn has not, asks to cancel the matching order, and answers a decision on the
card using only the stored tool results (the orders and the handbook's step 3),
never canned facts. It reads tool results as the model sees them, after the
middlewares, so it shows whether the denial rewrite reached it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from agent_service.agent_state import (
    Msg,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolResultState,
    ToolUseBlock,
)
from agent_service.model.base import (
    ChatModel,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    Usage,
)

ORDER_SKILL = "order-change"
AWAITING_SHIPMENT = "已支付待发货"
_ORDER_LINE = re.compile(
    r"订单 (?P<no>\d+) \| (?P<status>\S+) \| 实付 (?P<paid>[\d.]+) \| "
    r"下单 (?P<placed>[\d-]+ [\d:]+)\n\s+商品: (?P<items>[^\n]+)"
)
_CN_NUMBERS = "零一两三四五六七八九十"
_SLASH_COMMAND = re.compile(r"^/(?P<tool>[a-z_]+)\s*(?P<args>\{.*\})?\s*$", re.DOTALL)
_TOLD_FACT = re.compile(
    r"我的(?P<topic>[^，。？?！!\s]{1,12}?)是(?!什么|多少|哪)(?P<value>[^，。？?！!\n]{1,60})"
)
_ASKED_FACT = re.compile(r"我的(?P<topic>[^，。？?！!\s]{1,12}?)是(什么|多少|哪)")
SUMMARY_HEADER = "【早前对话摘要】"
_CHUNK = 12


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


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _count_cn(n: int) -> str:
    return _CN_NUMBERS[n] if 0 <= n < len(_CN_NUMBERS) else str(n)


class _View:
    """What the model can read off its context."""

    def __init__(self, request: ModelRequest) -> None:
        self.context: Sequence[Msg] = request.context
        self.summary = request.summary
        self.tools = {tool.name for tool in request.tools}
        start = 0
        for index, msg in enumerate(self.context):
            if msg.role is Role.USER and msg.text:
                start = index
        self.turn_start = start
        self.question = self.context[start].text if self.context else ""

    def results(self, name: str, *, this_turn: bool = False) -> list[ToolResultBlock]:
        messages = self.context[self.turn_start :] if this_turn else self.context
        return [
            block
            for msg in messages
            for block in msg.content
            if isinstance(block, ToolResultBlock) and block.name == name
        ]

    def calls(self, name: str, *, this_turn: bool = True) -> list[ToolUseBlock]:
        messages = self.context[self.turn_start :] if this_turn else self.context
        return [
            block
            for msg in messages
            for block in msg.content
            if isinstance(block, ToolUseBlock) and block.name == name
        ]

    def handbook(self) -> str:
        for result in self.results("load_skill"):
            if result.state is ToolResultState.SUCCESS and "订单变更" in result.text:
                return result.text
        return ""

    def handbook_step(self, number: int) -> str:
        match = re.search(rf"^{number}\.\s*(.+)$", self.handbook(), re.MULTILINE)
        return match.group(1).strip() if match else ""

    def call_id(self, name: str, arguments: dict[str, object]) -> str:
        """Deterministic for a given context, unique within a conversation."""
        uses = sum(isinstance(b, ToolUseBlock) for m in self.context for b in m.content)
        last = self.context[-1].id if self.context else ""
        seed = f"{last}|{uses}|{name}|{json.dumps(arguments, sort_keys=True)}"
        return f"call_{uses:02d}_{hashlib.sha256(seed.encode()).hexdigest()[:20]}"


class ScriptedOrderModel(ChatModel):
    name = "scripted-order-model"

    def __init__(self, step_delay_seconds: float = 0.0) -> None:
        # Simulated model latency before each reply (demos, and shutdown/stop tests).
        self.step_delay_seconds = step_delay_seconds

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if self.step_delay_seconds:
            await asyncio.sleep(self.step_delay_seconds)
        view = _View(request)
        thinking, text, call = self._decide(view)
        if thinking:
            yield ThinkingDelta(thinking)
        for start in range(0, len(text), _CHUNK):
            yield TextDelta(text[start : start + _CHUNK])
        if call is not None:
            name, arguments = call
            yield ToolCall(view.call_id(name, arguments), name, arguments)
        prompt_chars = sum(len(json.dumps(m.to_json(), ensure_ascii=False)) for m in view.context)
        yield Usage(input_tokens=prompt_chars // 2, output_tokens=(len(thinking) + len(text)) // 2)

    async def summarize(
        self, previous_summary: str, messages: Sequence[Msg], max_tokens: int
    ) -> str:
        """A deterministic extractive summary: what the user said, tool facts, replies.

        Within `max_tokens` (counted as characters, which over-counts for safety) it
        drops lines in this order: tool results, replies, the user's commands and
        questions, and last the facts the user stated about themselves.
        """
        lines = [line for line in previous_summary.splitlines() if line.startswith("- ")]
        for msg in messages:
            for block in msg.content:
                if isinstance(block, TextBlock) and msg.role is Role.USER and block.text:
                    kind = "用户说" if _TOLD_FACT.search(block.text) else "用户"
                    lines.append(f"- {kind}：{_one_line(block.text, 200)}")
                elif isinstance(block, TextBlock) and msg.role is Role.ASSISTANT and block.text:
                    lines.append(f"- 助手：{_one_line(block.text, 120)}")
                elif isinstance(block, ToolResultBlock):
                    head = " / ".join(block.text.splitlines()[:3])
                    lines.append(
                        f"- 工具 {block.name}（{block.state.value}）：{_one_line(head, 160)}"
                    )
        budget = max(200, max_tokens) - len(SUMMARY_HEADER)
        for prefix in ("- 工具", "- 助手", "- 用户：", "- 用户说"):
            while sum(len(line) + 1 for line in lines) > budget:
                victim = next((i for i, line in enumerate(lines) if line.startswith(prefix)), None)
                if victim is None:
                    break
                del lines[victim]
        return SUMMARY_HEADER + "\n" + "\n".join(lines)

    def _decide(self, view: _View) -> tuple[str, str, tuple[str, dict[str, object]] | None]:
        question = view.question
        if not question:
            return "", "你好，我可以帮你查询订单，或取消还没发货的订单。", None
        command = _SLASH_COMMAND.match(question)
        if command:
            return self._slash(view, command["tool"], command["args"] or "{}")
        asked = _ASKED_FACT.search(question)
        if asked:
            return self._recall(view, asked["topic"])
        told = _TOLD_FACT.search(question)
        if told:
            return "", f"好的，记住了：你的{told['topic']}是{told['value']}。", None
        wants_cancel = "取消" in question or "cancel" in question.lower()
        if wants_cancel and ("cancel_order" not in view.tools or not view.handbook()):
            return (
                "用户要取消订单，先加载订单变更手册。",
                "我先看一下订单变更的处理规范。",
                ("load_skill", {"name": ORDER_SKILL}),
            )
        order_results = view.results("query_order", this_turn=True)
        if not order_results:
            return ("先查最近5笔订单。", "", ("query_order", {"limit": 5}))
        orders = _parse_orders(order_results[-1].text)
        if not wants_cancel:
            return "", self._describe(question, orders), None
        matching = [o for o in orders if _mentions(question, o)]
        if not matching:
            return (
                "最近的订单里没有用户说的商品。",
                "最近5笔订单里没有找到你说的商品，能告诉我订单号吗？",
                None,
            )
        order = matching[0]
        cancels = [c for c in view.calls("cancel_order") if c.input.get("orderNo") == order.no]
        if cancels:
            return self._after_cancel(view, order, cancels[-1])
        if order.status != AWAITING_SHIPMENT:
            return (
                f"{order.no} 的状态是{order.status}，不能取消。",
                f"订单{order.no}目前是{order.status}状态，按规定只有已支付待发货的订单能取消。",
                None,
            )
        return (
            f"{order.no} {AWAITING_SHIPMENT}，可以取消，需要用户确认。",
            f"找到了订单{order.no}（{'、'.join(order.items)}，实付{order.paid}），"
            "还没发货，我来帮你取消，请在卡片上确认。",
            ("cancel_order", {"orderNo": order.no}),
        )

    def _slash(
        self, view: _View, tool: str, raw_args: str
    ) -> tuple[str, str, tuple[str, dict[str, object]] | None]:
        """`/tool {json}`: call that tool once, then report on its result."""
        results = [r for r in view.results(tool, this_turn=True)]
        if results:
            result = results[-1]
            first = result.text.splitlines()[0] if result.text else ""
            return (
                "",
                f"{tool} 返回了 {len(result.text)} 个字符（{result.state.value}）：{first}",
                None,
            )
        try:
            arguments = json.loads(raw_args)
        except ValueError:
            return "", f"参数不是合法的 JSON：{raw_args}", None
        return f"按用户的指令调用 {tool}。", "", (tool, arguments)

    def _recall(
        self, view: _View, topic: str
    ) -> tuple[str, str, tuple[str, dict[str, object]] | None]:
        """Answer from what the user said earlier: in the context or in the summary."""
        sources = [m.text for m in view.context if m.role is Role.USER and m.text]
        sources += [line for line in view.summary.splitlines() if line.startswith("- 用户说")]
        for text in reversed(sources):
            for match in _TOLD_FACT.finditer(text):
                if match["topic"] == topic:
                    where = "（从之前的对话摘要里找到的）" if text in view.summary else ""
                    return "", f"你之前说过，你的{topic}是{match['value']}。{where}", None
        return "", f"我没有找到你之前说过的{topic}。", None

    def _after_cancel(
        self, view: _View, order: _Order, call: ToolUseBlock
    ) -> tuple[str, str, tuple[str, dict[str, object]] | None]:
        result = next((r for r in view.results("cancel_order") if r.id == call.id), None)
        if result is None:
            return "取消还在等用户确认。", "取消还在等你在卡片上确认。", None
        if result.state is ToolResultState.SUCCESS:
            return "取消成功，如实告诉用户结果。", f"已经帮你取消了。{result.text}", None
        if result.state is ToolResultState.DENIED:
            if "确认卡片上点了取消" in result.text:
                return "用户在确认卡上点了取消，如实说明。", self._denial_reply(view, order), None
            # The framework's raw wording reads like missing rights.
            return (
                "工具返回权限不足。",
                f"取消订单{order.no}失败：没有权限执行这个操作，可能需要先开通相应权限后再试。",
                None,
            )
        if result.state is ToolResultState.INTERRUPTED:
            return "", f"这次取消没有执行：{result.text}订单{order.no}没有变化。", None
        return "", f"取消没有成功：{result.text}", None

    def _denial_reply(self, view: _View, order: _Order) -> str:
        lines = [
            f"这次取消没有执行——你在确认卡片上点了「取消」，所以我停下来了，"
            f"订单{order.no}目前还是{order.status}状态。"
        ]
        step = view.handbook_step(3)
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

    def _describe(self, question: str, orders: list[_Order]) -> str:
        named = [o for o in orders if o.no in question or _mentions(question, o)]
        shown = named or orders
        parts = [f"订单{o.no}：{o.status}，实付{o.paid}，下单{o.placed}" for o in shown]
        return "；".join(parts) + "。" if parts else "没有找到订单。"
