"""The ReAct loop: model step, tool calls, until an answer, a card or the step limit.

It works on the loaded AgentState in place and on the turn's reply record; it
never reaches the state service (the runner saves what it did).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta

from agentstate.agent_service.agent_state import (
    AgentState,
    Block,
    Msg,
    Role,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolResultState,
    ToolUseBlock,
    ToolUseState,
)
from agentstate.agent_service.context.manager import ContextManager
from agentstate.agent_service.events import (
    CallStatus,
    CardCall,
    CardShown,
    Delta,
    DeltaKind,
    Emit,
    Finished,
    Hint,
    Progress,
    ToolStatus,
)
from agentstate.agent_service.middleware import ContextMiddleware
from agentstate.agent_service.model.base import (
    ChatModel,
    ModelRequest,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    Usage,
    Waiting,
)
from agentstate.agent_service.runtime import cards, texts
from agentstate.agent_service.runtime.cards import Card, CardEntry, CardStatus
from agentstate.agent_service.runtime.persistence import TurnRecord
from agentstate.agent_service.telemetry import CONTEXT_SECONDS
from agentstate.agent_service.tools.registry import (
    ArgumentError,
    Permission,
    ToolContext,
    ToolRegistry,
    check_arguments,
    idempotency_key_of,
)
from agentstate.agent_service.tools.skills import active_skills
from agentstate.agent_service.turns import TurnControl
from agentstate.common.telemetry import tracer

log = logging.getLogger(__name__)


class ReactLoop:
    def __init__(
        self,
        *,
        model: ChatModel,
        tools: ToolRegistry,
        context: ContextManager,
        middlewares: Sequence[ContextMiddleware],
        system_prompt: str,
        max_steps: int,
        card_ttl: timedelta,
    ) -> None:
        self.model = model
        self.tools = tools
        self.context = context
        self.middlewares = tuple(middlewares)
        self.system_prompt = system_prompt
        self.max_steps = max_steps
        self.card_ttl = card_ttl

    async def answer_card(
        self,
        control: TurnControl,
        state: AgentState,
        decision: Msg,
        record: TurnRecord,
        emit: Emit,
    ) -> None:
        """Answer the card's pending calls: run the approved ones, deny the rest."""
        approved = cards.approvals(decision)
        for message, call in state.pending_calls():
            if approved.get(call.id):
                result = await self._run_tool(control, message, call, emit)
            else:
                result = cards.denied(call)
                await emit(ToolStatus(call.id, call.name, CallStatus.DENIED, call.input))
            # The stored tool_use keeps its `asking` state; the result settles it.
            state.context.append(Msg(role=Role.TOOL, content=[result]))
            record.add(result)

    async def run(
        self, control: TurnControl, state: AgentState, record: TurnRecord, emit: Emit
    ) -> Finished | CardShown:
        for step in range(1, self.max_steps + 1):
            control.checkpoint()
            state.cur_iter = step
            assistant = await self._model_step(control, state, record, emit)
            calls = assistant.blocks_of(ToolUseBlock)
            if not calls:
                state.context.append(assistant)
                return Finished(record.record_id)
            active = active_skills(state.context)
            # Only a call that could run goes on a card; any other gets its error at once.
            asking = [c for c in calls if self._card_worthy(c, active)]
            results: list[ToolResultBlock] = []
            for call in calls:
                if call in asking:
                    call.state = ToolUseState.ASKING
                    continue
                call.state = ToolUseState.ALLOWED
                results.append(await self._run_tool(control, assistant, call, emit, active))
            # The assistant message and its results enter the context together,
            # so a stop between steps never leaves a half-finished cycle.
            state.context.append(assistant)
            for result in results:
                state.context.append(Msg(role=Role.TOOL, content=[result]))
                record.add(result)
            if asking:
                return await self._show_card(assistant, asking, record, emit)
        state.context.append(Msg(role=Role.ASSISTANT, content=[TextBlock(texts.TOO_MANY_STEPS)]))
        record.add(TextBlock(texts.TOO_MANY_STEPS))
        await emit(Delta(DeltaKind.RESPONSE, texts.TOO_MANY_STEPS))
        return Finished(record.record_id)

    def _card_worthy(self, call: ToolUseBlock, active: set[str]) -> bool:
        tool = self.tools.get(call.name)
        if tool is None or tool.permission is not Permission.ASK:
            return False
        if tool.skill is not None and tool.skill not in active:
            return False
        try:
            check_arguments(tool.spec, call.input)
        except ArgumentError:
            return False
        return True

    async def _model_step(
        self, control: TurnControl, state: AgentState, record: TurnRecord, emit: Emit
    ) -> Msg:
        tools = self.tools.specs(active_skills(state.context))
        # Compaction may ask the model for a summary: a Stop interrupts that call too.
        report = await control.interruptible(self.context.prepare(state, tools))
        CONTEXT_SECONDS.record(
            report.trim_seconds + report.compact_seconds,
            {"trimmed": report.trimmed > 0, "compacted": bool(report.compactions)},
        )
        if report.compactions:
            record.compactions += report.compactions
            for done in report.compactions:
                record.timeline.add(
                    "compaction",
                    "context compacted",
                    messages=f"{done.messages_before} -> {done.messages_after}",
                    tokens=f"{done.tokens_before} -> {done.tokens_after}",
                    reason=done.reason,
                )
            tools = self.tools.specs(active_skills(state.context))  # a handbook may be gone
            await emit(Hint(texts.HINT_COMPACTED))
        # Middlewares get a copy of the list and replace what they change: what they
        # change is never stored, and nothing is copied per step for what they don't.
        context = list(state.context)
        for middleware in self.middlewares:
            context = middleware(context)
        request = ModelRequest(
            system_prompt=self.system_prompt,
            context=context,
            tools=tools,
            summary=state.summary,
        )
        thinking: list[str] = []
        text: list[str] = []
        calls: list[ToolCall] = []
        usage: dict[str, int] | None = None
        with tracer().start_as_current_span("model.call") as span:
            span.set_attributes(
                {
                    "gen_ai.request.model": self.model.name,
                    "agentstate.model.step": state.cur_iter,
                    "agentstate.context.tokens": report.tokens,
                    "agentstate.context.messages": len(context),
                    "agentstate.context.trimmed": report.trimmed,
                    "agentstate.context.compactions": len(report.compactions),
                }
            )

            async def receive() -> None:
                nonlocal usage
                async for event in self.model.stream(request):
                    control.checkpoint()
                    if isinstance(event, ThinkingDelta):
                        thinking.append(event.text)
                        await emit(Delta(DeltaKind.THINKING, event.text))
                    elif isinstance(event, TextDelta):
                        text.append(event.text)
                        await emit(Delta(DeltaKind.RESPONSE, event.text))
                    elif isinstance(event, ToolCall):
                        calls.append(event)
                    elif isinstance(event, Waiting):
                        await emit(
                            Progress(
                                event.attempt, event.attempts, event.elapsed_seconds, event.note
                            )
                        )
                    elif isinstance(event, Usage):
                        usage = {
                            "input_tokens": event.input_tokens,
                            "output_tokens": event.output_tokens,
                        }
                        span.set_attribute("gen_ai.usage.input_tokens", event.input_tokens)
                        span.set_attribute("gen_ai.usage.output_tokens", event.output_tokens)

            began = time.monotonic()
            try:
                # A Stop cancels the call in flight (and its HTTP request) at once.
                await control.interruptible(receive())
            except BaseException as exc:
                record.timeline.add(
                    "model",
                    self.model.name,
                    began,
                    step=state.cur_iter,
                    failed=type(exc).__name__,
                    tokens=usage,
                )
                # Stopped, failed or cancelled mid-answer: the record keeps what the
                # user already saw of it; the state does not (it is not an answer).
                if thinking:
                    record.add(ThinkingBlock("".join(thinking)))
                if text:
                    record.add(TextBlock("".join(text)))
                raise
            span.set_attribute("agentstate.model.tool_calls", len(calls))
            record.timeline.add(
                "model",
                self.model.name,
                began,
                step=state.cur_iter,
                tokens=usage,
                context_messages=len(context),
                text_chars=sum(map(len, text)),
                tool_calls=[c.name for c in calls],
            )
        content: list[Block] = []
        if thinking:
            content.append(ThinkingBlock("".join(thinking)))
        if text:
            content.append(TextBlock("".join(text)))
        taken = _call_ids(state.context)
        for call in calls:
            call_id = _unique_call_id(call.id, taken)
            content.append(ToolUseBlock(call_id, call.name, dict(call.arguments)))
        for block in content:
            record.add(block)
        return Msg(role=Role.ASSISTANT, content=content, usage=usage)

    async def _run_tool(
        self,
        control: TurnControl,
        message: Msg,
        call: ToolUseBlock,
        emit: Emit,
        active: set[str] | None = None,
    ) -> ToolResultBlock:
        """Run one call of the assistant `message`. `active`: the skills in context, when
        offering matters (a call the user approved on a card runs even if its handbook
        was compacted since)."""
        position = next(i for i, block in enumerate(message.content) if block is call)
        context = ToolContext(
            user_id=control.user_id,
            conversation_id=control.conversation_id,
            call_id=call.id,
            idempotency_key=idempotency_key_of(control.conversation_id, message.id, position),
        )
        with tracer().start_as_current_span("tool.call") as span:
            span.set_attributes({"gen_ai.tool.name": call.name, "gen_ai.tool.call.id": call.id})
            result = await self._run_tool_traced(context, call, emit, active)
            span.set_attribute("agentstate.tool.outcome", result.state.value)
            return result

    async def _run_tool_traced(
        self,
        context: ToolContext,
        call: ToolUseBlock,
        emit: Emit,
        active: set[str] | None,
    ) -> ToolResultBlock:
        await emit(ToolStatus(call.id, call.name, CallStatus.RUNNING, call.input))
        tool = self.tools.get(call.name)
        if tool is None:
            text, ok = texts.NO_SUCH_TOOL.format(name=call.name), False
        elif active is not None and tool.skill is not None and tool.skill not in active:
            text, ok = texts.TOOL_NEEDS_SKILL.format(name=call.name, skill=tool.skill), False
        else:
            try:
                arguments = check_arguments(tool.spec, call.input)
                output = await tool.run(arguments, context)
                text, ok = output.text, output.ok
            except ArgumentError as exc:
                text, ok = texts.BAD_ARGUMENTS.format(error=exc), False
            except Exception as exc:  # a tool's bug must not kill the turn
                log.exception("tool %s failed", call.name)
                text, ok = texts.TOOL_FAILED.format(error=exc), False
        state = ToolResultState.SUCCESS if ok else ToolResultState.ERROR
        await emit(
            ToolStatus(
                call.id,
                call.name,
                CallStatus.SUCCEEDED if ok else CallStatus.FAILED,
                call.input,
                summary=text[:200],
            )
        )
        return ToolResultBlock.of_text(call.id, call.name, state, text)

    async def _show_card(
        self,
        assistant: Msg,
        asking: list[ToolUseBlock],
        record: TurnRecord,
        emit: Emit,
    ) -> CardShown:
        calls = []
        for call in asking:
            tool = self.tools.get(call.name)
            assert tool is not None
            calls.append(
                CardCall(
                    call_id=call.id,
                    name=call.name,
                    title=tool.card_title(call.input) or call.name,
                    fields=tool.card_fields(call.input),
                    arguments=call.input,
                )
            )
            await emit(ToolStatus(call.id, call.name, CallStatus.ASKING, call.input))
        title = (
            calls[0].title
            if len(calls) == 1
            else texts.MULTI_CALL_CARD_TITLE.format(count=len(calls))
        )
        card = Card(
            record_id=record.record_id,
            title=title,
            expires_at=cards.now() + self.card_ttl,
            status=CardStatus.PENDING,
            calls=[CardEntry(c.call_id, c.name, c.title, c.fields) for c in calls],
        )
        assistant.metadata[cards.CARD_METADATA_KEY] = card.to_json()
        return CardShown(record.record_id, title, calls, card.expires_at, card.to_json())


def _call_ids(context: Sequence[Msg]) -> set[str]:
    """The call ids the conversation's context already uses (calls and results)."""
    return {
        block.id
        for msg in context
        for block in msg.content
        if isinstance(block, ToolUseBlock | ToolResultBlock)
    }


def _unique_call_id(call_id: str, taken: set[str]) -> str:
    """The provider's call id, unless the conversation already uses it: some providers
    repeat ids across responses, and a call is pending only while no result carries its
    id, so the stored ids must be unique in the conversation. Adds the id it returns."""
    if call_id in taken:
        call_id = f"call_{uuid.uuid4().hex}"
    taken.add(call_id)
    return call_id
