"""A deterministic model: the offline default, for tests, demos and development.

It decides every step from what is in the context it is given, the way a real
model would, and it reads tool results as the model sees them (after the
middlewares). This base knows nothing of any business: it calls a tool when
told to (`/tool {json}`), remembers what the user says about themselves
("我的X是Y") and answers it back, even from the compaction summary, writes
deterministic summaries, and otherwise says it has no business tools. A
profile's scripted model (examples/order_demo/model.py) subclasses it and
overrides `answer` with its domain's steps.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import msgspec

from agentstate.agent_service.agent_state import (
    Msg,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from agentstate.agent_service.model.base import (
    ChatModel,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    Usage,
)

_SLASH_COMMAND = re.compile(r"^/(?P<tool>[a-z_]+)\s*(?P<args>\{.*\})?\s*$", re.DOTALL)
_TOLD_FACT = re.compile(
    r"我的(?P<topic>[^，。？?！!\s]{1,12}?)是(?!什么|多少|哪)(?P<value>[^，。？?！!\n]{1,60})"
)
_ASKED_FACT = re.compile(r"我的(?P<topic>[^，。？?！!\s]{1,12}?)是(什么|多少|哪)")
SUMMARY_HEADER = "【早前对话摘要】"
_CHUNK = 12


@dataclass(frozen=True)
class Step:
    """One model reply: thinking, text, and at most one tool call (name, arguments)."""

    thinking: str = ""
    text: str = ""
    call: tuple[str, dict[str, object]] | None = None


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


_CONTEXT_ENCODER = msgspec.json.Encoder()


class ScriptedView:
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

    def call_id(self, name: str, arguments: dict[str, object]) -> str:
        """Deterministic for a given context, unique within a conversation."""
        uses = sum(isinstance(b, ToolUseBlock) for m in self.context for b in m.content)
        last = self.context[-1].id if self.context else ""
        seed = f"{last}|{uses}|{name}|{json.dumps(arguments, sort_keys=True)}"
        return f"call_{uses:02d}_{hashlib.sha256(seed.encode()).hexdigest()[:20]}"


class ScriptedModel(ChatModel):
    name = "scripted-model"
    # The reply to a context without a question.
    greeting = "你好，我是通用助手。这里没有配置业务工具，你可以告诉我关于你的事，我会记住。"
    # The reply to anything else: the product without a profile has no business to do.
    no_business = (
        "这个助手没有配置业务能力（没有选择 AGENT_PROFILE），不能查询或办理业务。"
        "你可以告诉我关于你的事（例如“我的名字是…”），之后我能回答你。"
    )

    def __init__(self, step_delay_seconds: float = 0.0) -> None:
        # Simulated model latency before each reply (demos, and shutdown/stop tests).
        self.step_delay_seconds = step_delay_seconds

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if self.step_delay_seconds:
            await asyncio.sleep(self.step_delay_seconds)
        view = ScriptedView(request)
        step = self.decide(view)
        if step.thinking:
            yield ThinkingDelta(step.thinking)
        for start in range(0, len(step.text), _CHUNK):
            yield TextDelta(step.text[start : start + _CHUNK])
        if step.call is not None:
            name, arguments = step.call
            yield ToolCall(view.call_id(name, arguments), name, arguments)
        # An estimate from the encoded context (one pass in C: the scripted model should
        # not cost the runtime more at 512 messages than a real model's client does).
        prompt_bytes = len(_CONTEXT_ENCODER.encode(list(view.context)))
        yield Usage(
            input_tokens=prompt_bytes // 3,
            output_tokens=(len(step.thinking) + len(step.text)) // 2,
        )

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

    def decide(self, view: ScriptedView) -> Step:
        """What any profile's scripted model does first; the rest is `answer`'s."""
        question = view.question
        if not question:
            return Step(text=self.greeting)
        command = _SLASH_COMMAND.match(question)
        if command:
            return self._slash(view, command["tool"], command["args"] or "{}")
        asked = _ASKED_FACT.search(question)
        if asked:
            return self._recall(view, asked["topic"])
        told = _TOLD_FACT.search(question)
        if told:
            return Step(text=f"好的，记住了：你的{told['topic']}是{told['value']}。")
        return self.answer(view)

    def answer(self, view: ScriptedView) -> Step:
        """The domain's part: a profile's scripted model overrides it."""
        return Step(text=self.no_business)

    def _slash(self, view: ScriptedView, tool: str, raw_args: str) -> Step:
        """`/tool {json}`: call that tool once, then report on its result."""
        results = view.results(tool, this_turn=True)
        if results:
            result = results[-1]
            first = result.text.splitlines()[0] if result.text else ""
            return Step(
                text=f"{tool} 返回了 {len(result.text)} 个字符（{result.state.value}）：{first}"
            )
        try:
            arguments = json.loads(raw_args)
        except ValueError:
            return Step(text=f"参数不是合法的 JSON：{raw_args}")
        return Step(thinking=f"按用户的指令调用 {tool}。", call=(tool, arguments))

    def _recall(self, view: ScriptedView, topic: str) -> Step:
        """Answer from what the user said earlier: in the context or in the summary."""
        sources = [m.text for m in view.context if m.role is Role.USER and m.text]
        sources += [line for line in view.summary.splitlines() if line.startswith("- 用户说")]
        for text in reversed(sources):
            for match in _TOLD_FACT.finditer(text):
                if match["topic"] == topic:
                    where = "（从之前的对话摘要里找到的）" if text in view.summary else ""
                    return Step(text=f"你之前说过，你的{topic}是{match['value']}。{where}")
        return Step(text=f"我没有找到你之前说过的{topic}。")
