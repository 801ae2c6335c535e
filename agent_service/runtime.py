"""The turn runner: one Chat or Confirm turn, from lease to saved state.

A turn: take the conversation's run lease, load the state (a load failure ends
the turn: never start fresh over a state that exists), run the ReAct loop,
save the whole state with the version it loaded (compare-and-set) together
with the turn's UI message records, release the lease. Knows nothing of gRPC
or SQL: state goes through StateClient, the model through ChatModel.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span

from agent_service import errors
from agent_service.agent_state import (
    PERMISSION_DENIED_TEXT,
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
from agent_service.context.manager import CompactionDone, ContextManager
from agent_service.events import (
    CallStatus,
    Cancelled,
    CardCall,
    CardShown,
    Delta,
    DeltaKind,
    Done,
    Emit,
    Finished,
    Hint,
    Meta,
    ToolStatus,
    TurnEvent,
)
from agent_service.middleware import DEFAULT_MIDDLEWARES, ContextMiddleware
from agent_service.model.base import (
    ChatModel,
    ModelError,
    ModelRequest,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    Usage,
)
from agent_service.state_client import StateClient
from agent_service.telemetry import (
    CONFIRMATIONS,
    CONTEXT_SECONDS,
    LEASE_CONFLICTS,
    RUNNING_TURNS,
    user_attribute,
)
from agent_service.tools.registry import (
    ArgumentError,
    Permission,
    ToolContext,
    ToolRegistry,
    check_arguments,
)
from agent_service.tools.skills import active_skills
from agent_service.turns import TurnControl, TurnRegistry, TurnStopped
from agentstate.common.telemetry import tracer
from agentstate.state.v1 import state_service_pb2 as spb

log = logging.getLogger(__name__)

MAX_QUESTION_CHARS = 8000
# How many recent records to look at when repairing a turn that never finished.
REPAIR_WINDOW = 20
CARD_METADATA_KEY = "confirm"
CONFIRM_RESULTS_KEY = "confirm_results"
EXPIRED_CARD_TEXT = "确认卡片已过期，操作没有执行。"
STOPPED_TEXT = "这一轮被中断，操作没有执行。"

SYSTEM_PROMPT = (
    "你是电商平台的售后助手。按需加载业务手册（load_skill）并严格按手册步骤办事；"
    "只根据工具返回和对话里已有的信息回答，不编造订单信息；"
    "会改变订单的操作需要用户在确认卡片上确认。"
)


@dataclass(frozen=True)
class RuntimeSettings:
    holder: str = "agent"  # this replica's name, recorded on leases
    lease_ttl_ms: int = 15_000
    lease_renew_seconds: float = 2.0
    max_turns_per_user: int = 5
    card_ttl_seconds: float = 900.0
    max_steps: int = 8
    trace_user_id: str = "hash"  # how spans carry the end user: hash, plain or omit


@dataclass
class _TurnRecord:
    """The assistant message record of this turn (what the user sees), and what
    context management did during the turn."""

    record_id: str
    blocks: list[dict[str, Any]] = field(default_factory=list)
    compactions: list[CompactionDone] = field(default_factory=list)

    def add(self, block: Block) -> None:
        self.blocks.append(block.to_json())


def _blocks_json(blocks: list[dict[str, Any]]) -> bytes:
    return json.dumps(blocks, ensure_ascii=False).encode()


def _now() -> datetime:
    return datetime.now(UTC)


def _card_of(msg: Msg) -> dict[str, Any]:
    card = msg.metadata.get(CARD_METADATA_KEY)
    return card if isinstance(card, dict) else {}


def _card_expired(card: dict[str, Any], now: datetime) -> bool:
    """A pending call without a card of ours (say, left by another runtime) counts as expired."""
    expires = card.get("expires_at")
    if not isinstance(expires, str) or "record_id" not in card:
        return True
    return datetime.fromisoformat(expires) <= now


class TurnRunner:
    def __init__(
        self,
        *,
        state: StateClient,
        model: ChatModel,
        tools: ToolRegistry,
        settings: RuntimeSettings,
        registry: TurnRegistry,
        context: ContextManager,
        middlewares: tuple[ContextMiddleware, ...] = DEFAULT_MIDDLEWARES,
        system_prompt: str = SYSTEM_PROMPT,
    ) -> None:
        self.state = state
        self.context = context
        self.model = model
        self.tools = tools
        self.settings = settings
        self.registry = registry
        self.middlewares = middlewares
        self.system_prompt = system_prompt

    # ------------------------------------------------------------ entry points

    @contextlib.contextmanager
    def _turn_span(self, kind: str, user_id: str, conversation_id: str) -> Iterator[Span]:
        """The turn's span: everything the turn does (state, model, tools) nests under it."""
        with tracer().start_as_current_span(f"agent.turn {kind}") as span:
            user = user_attribute(user_id, self.settings.trace_user_id)
            if user is not None:
                span.set_attribute("enduser.id", user)
            if conversation_id:
                span.set_attribute("agentstate.conversation_id", conversation_id)
            RUNNING_TURNS.add(1)
            try:
                yield span
            except errors.AgentError as exc:
                span.set_attribute("agentstate.turn.outcome", f"error:{type(exc).__name__}")
                raise
            finally:
                RUNNING_TURNS.add(-1)

    async def chat(self, user_id: str, conversation_id: str, question: str, emit: Emit) -> None:
        with self._turn_span("Chat", user_id, conversation_id):
            await self._chat(user_id, conversation_id, question, emit)

    async def _chat(self, user_id: str, conversation_id: str, question: str, emit: Emit) -> None:
        question = question.strip()
        if not question:
            raise errors.InvalidInput("question must not be empty")
        if len(question) > MAX_QUESTION_CHARS:
            raise errors.InvalidInput(f"question is longer than {MAX_QUESTION_CHARS} characters")
        self._ensure_accepting()
        new_conversation = not conversation_id
        if not new_conversation:
            # No separate existence check: taking the lease is NOT_FOUND for a missing one.
            await self._chat_turn(user_id, conversation_id, question, emit, new_conversation)
            return
        title = " ".join(question.split())[:40]
        conversation_id = (await self.state.create_conversation(user_id, title)).conversation_id
        started = False

        async def tracking_emit(event: TurnEvent) -> None:
            nonlocal started
            started = True
            await emit(event)

        try:
            await self._chat_turn(user_id, conversation_id, question, tracking_emit, True)
        except errors.AgentError:
            if not started:  # refused before it began: leave no empty conversation behind
                with contextlib.suppress(errors.AgentError):
                    await self.state.delete_conversations(user_id, [conversation_id])
            raise

    async def _chat_turn(
        self,
        user_id: str,
        conversation_id: str,
        question: str,
        emit: Emit,
        new_conversation: bool,
    ) -> None:
        async with self._lease(user_id, conversation_id) as control:
            loaded = await self.state.load(user_id, conversation_id)
            state = loaded.state or AgentState(session_id=conversation_id, user_id=user_id)
            hints = self._recover_interrupted(state, control)
            writes: list[spb.MessageWrite] = []
            pending = state.pending_calls()
            if pending:
                card_msg = pending[0][0]
                card = _card_of(card_msg)
                if not _card_expired(card, _now()):
                    raise errors.Conflict(
                        f"confirmation card {card['record_id']} is still pending: "
                        "answer it with Confirm before asking something new"
                    )
                writes += self._settle_expired(state, card_msg)
                hints.append("上一张确认卡片已过期，其中的操作没有执行。")
            await self.state.append_message(
                user_id,
                conversation_id,
                spb.NewMessage(
                    role=spb.MESSAGE_ROLE_USER,
                    blocks_json=_blocks_json([TextBlock(question).to_json()]),
                ),
            )
            record = await self._open_record(user_id, conversation_id)
            await emit(Meta(conversation_id, control.task_id, new_conversation))
            for hint in hints:
                await emit(Hint(hint))
            # A new question is one user message holding only its text.
            state.context.append(Msg(role=Role.USER, name="user", content=[TextBlock(question)]))
            state.reply_id = control.task_id
            outcome = await self._run_and_save(control, state, loaded.version, record, writes, emit)
        await self._finish(outcome, emit)

    async def confirm(
        self, user_id: str, conversation_id: str, message_id: str, approved: bool, emit: Emit
    ) -> None:
        with self._turn_span("Confirm", user_id, conversation_id) as span:
            span.set_attribute("agentstate.confirm.approved", approved)
            await self._confirm(user_id, conversation_id, message_id, approved, emit)

    async def _confirm(
        self, user_id: str, conversation_id: str, message_id: str, approved: bool, emit: Emit
    ) -> None:
        if not message_id:
            raise errors.InvalidInput("message_id is required")
        self._ensure_accepting()
        async with self._lease(user_id, conversation_id) as control:
            loaded = await self.state.load(user_id, conversation_id)
            if loaded.state is None:
                raise errors.NotFound(f"confirmation card {message_id} not found")
            state = loaded.state
            hints = self._recover_interrupted(state, control)
            pending = state.pending_calls()
            card_msg = pending[0][0] if pending else None
            card = _card_of(card_msg) if card_msg else {}
            if card_msg is None or card.get("record_id") != message_id:
                # Not the pending card: an old one (already handled) or none at all.
                await self.state.get_message(user_id, conversation_id, message_id)
                raise errors.Conflict(f"confirmation card {message_id} was already handled")
            if _card_expired(card, _now()):
                writes = self._settle_expired(state, card_msg)
                await self.state.save(user_id, conversation_id, state, loaded.version, writes)
                CONFIRMATIONS.add(1, {"decision": "expired"})
                raise errors.Conflict(
                    f"confirmation card {message_id} expired at {card['expires_at']}; "
                    "its operations were not executed"
                )
            # The confirmation reaches the runtime as a message with no text whose
            # metadata carries the decisions; it never enters the model context.
            decision = Msg(
                role=Role.USER,
                name="user",
                content=[],
                metadata={
                    CONFIRM_RESULTS_KEY: [
                        {"call_id": call.id, "approved": approved} for _, call in pending
                    ]
                },
            )
            record = await self._open_record(user_id, conversation_id)
            await emit(Meta(conversation_id, control.task_id, False))
            for hint in hints:
                await emit(Hint(hint))
            card["status"] = "approved" if approved else "denied"
            CONFIRMATIONS.add(1, {"decision": card["status"]})
            writes = [
                spb.MessageWrite(
                    update=spb.MessageUpdate(
                        message_id=message_id,
                        status=spb.MESSAGE_STATUS_NORMAL,
                        metadata_json=json.dumps({"card": card}, ensure_ascii=False).encode(),
                        expected_status=spb.MESSAGE_STATUS_AWAITING_CONFIRM,
                    )
                )
            ]
            state.reply_id = control.task_id
            outcome = await self._run_and_save(
                control, state, loaded.version, record, writes, emit, decision=decision
            )
        await self._finish(outcome, emit)

    async def stop(self, user_id: str, task_id: str) -> str:
        """Ask a running turn to stop; returns its conversation id."""
        lease = await self.state.request_stop(user_id, task_id)
        local = self.registry.get(task_id)
        if local is not None:
            local.request_stop("stopped by the user")
        return str(lease.conversation_id)

    # ----------------------------------------------------------------- lease

    def _ensure_accepting(self) -> None:
        if self.registry.draining:
            raise errors.Unavailable("this agent replica is shutting down; retry on another")

    @contextlib.asynccontextmanager
    async def _lease(self, user_id: str, conversation_id: str) -> AsyncIterator[TurnControl]:
        self._ensure_accepting()
        try:
            acquired = await self.state.acquire_lease(
                user_id,
                conversation_id,
                self.settings.holder,
                self.settings.lease_ttl_ms,
                self.settings.max_turns_per_user,
            )
        except errors.Conflict:
            LEASE_CONFLICTS.add(1)
            raise
        control = TurnControl(user_id, conversation_id, str(acquired.lease.task_id))
        if acquired.lapsed_task_id:
            control.repaired_records = await self._repair_lapsed_turn(user_id, conversation_id)
        span = trace.get_current_span()
        span.set_attribute("agentstate.conversation_id", conversation_id)
        span.set_attribute("agentstate.task_id", control.task_id)
        task = asyncio.current_task()
        assert task is not None
        self.registry.add(control, task)
        heartbeat = asyncio.create_task(self._heartbeat(control))
        try:
            yield control
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            try:
                await asyncio.shield(self.state.release_lease(user_id, control.task_id))
            except errors.AgentError as exc:
                # It lapses by itself after its ttl.
                log.warning("could not release lease of task %s: %s", control.task_id, exc)

    async def _repair_lapsed_turn(self, user_id: str, conversation_id: str) -> int:
        """An earlier turn died without saving (its lease lapsed, never released): mark
        its records that still say STREAMING as INTERRUPTED. Its state was never saved,
        so the stored context is still the one before that turn."""
        page = await self.state.list_messages(
            user_id, conversation_id, REPAIR_WINDOW, "", newest_first=True
        )
        repaired = 0
        for record in page.messages:
            if record.status != spb.MESSAGE_STATUS_STREAMING:
                continue
            try:
                await self.state.update_message(
                    user_id,
                    conversation_id,
                    spb.MessageUpdate(
                        message_id=record.message_id,
                        status=spb.MESSAGE_STATUS_INTERRUPTED,
                        expected_status=spb.MESSAGE_STATUS_STREAMING,
                    ),
                )
                repaired += 1
            except errors.Conflict:
                continue  # settled meanwhile
        if repaired:
            log.warning(
                "conversation %s: marked %d records of a turn that never finished as interrupted",
                conversation_id,
                repaired,
            )
        return repaired

    async def _heartbeat(self, control: TurnControl) -> None:
        """Keep the lease alive; pick up Stop requests made on any replica."""
        while True:
            await asyncio.sleep(self.settings.lease_renew_seconds)
            try:
                lease = await self.state.renew_lease(
                    control.user_id, control.task_id, self.settings.lease_ttl_ms
                )
            except errors.Conflict:
                control.request_stop("the run lease was lost")
                return
            except errors.AgentError as exc:
                log.warning("lease renewal failed for task %s: %s", control.task_id, exc)
                continue
            if lease.stop_requested:
                control.request_stop("stopped by the user")

    # ------------------------------------------------------------- the turn

    async def _open_record(self, user_id: str, conversation_id: str) -> _TurnRecord:
        record = await self.state.append_message(
            user_id,
            conversation_id,
            spb.NewMessage(role=spb.MESSAGE_ROLE_ASSISTANT, status=spb.MESSAGE_STATUS_STREAMING),
        )
        return _TurnRecord(record.message_id)

    def _recover_interrupted(self, state: AgentState, control: TurnControl) -> list[str]:
        hints = []
        if state.shutdown_interrupted:
            state.shutdown_interrupted = False
            hints.append("上一轮因服务停机被中断，已从保存的状态继续。")
        if control.repaired_records:
            hints.append("上一轮没有正常结束（服务异常退出），它未完成的回复已标记为中断。")
        return hints

    def _settle_expired(self, state: AgentState, card_msg: Msg) -> list[spb.MessageWrite]:
        """Answer every pending call of an expired card as not executed."""
        for _, call in state.pending_calls():
            state.context.append(
                Msg(
                    role=Role.TOOL,
                    content=[
                        ToolResultBlock.of_text(
                            call.id, call.name, ToolResultState.INTERRUPTED, EXPIRED_CARD_TEXT
                        )
                    ],
                )
            )
        card = dict(_card_of(card_msg), status="expired")
        if "record_id" not in card:
            return []
        return [
            spb.MessageWrite(
                update=spb.MessageUpdate(
                    message_id=str(card.get("record_id", "")),
                    status=spb.MESSAGE_STATUS_NORMAL,
                    metadata_json=json.dumps({"card": card}, ensure_ascii=False).encode(),
                    expected_status=spb.MESSAGE_STATUS_AWAITING_CONFIRM,
                )
            )
        ]

    async def _run_and_save(
        self,
        control: TurnControl,
        state: AgentState,
        version: int,
        record: _TurnRecord,
        writes: list[spb.MessageWrite],
        emit: Emit,
        *,
        decision: Msg | None = None,
    ) -> Finished | CardShown | Cancelled:
        """Run the loop; save whatever it completed, whatever way it ends; return the outcome."""
        outcome: Finished | CardShown | Cancelled
        status = spb.MESSAGE_STATUS_NORMAL
        metadata: dict[str, Any] = {}
        failure: errors.AgentError | None = None
        try:
            if decision is not None:
                await self._apply_decision(control, state, decision, record, emit)
            outcome = await self._react(control, state, record, emit)
            if isinstance(outcome, CardShown):
                status = spb.MESSAGE_STATUS_AWAITING_CONFIRM
                metadata = {"card": outcome.card}
        except (TurnStopped, asyncio.CancelledError) as exc:
            reason = control.stop_reason or "interrupted"
            if isinstance(exc, asyncio.CancelledError):
                control.request_stop("the service is shutting down", shutdown=True)
                reason = control.stop_reason or reason
            state.shutdown_interrupted = control.shutdown
            status = spb.MESSAGE_STATUS_INTERRUPTED
            outcome = Cancelled(record.record_id, reason)
        except ModelError as exc:
            failure = errors.Unavailable(f"the model failed: {exc}")
            status = spb.MESSAGE_STATUS_ERROR
            outcome = Cancelled(record.record_id, str(failure))
        if decision is not None and state.pending_calls():
            writes = []  # interrupted before every call was answered: the card stays open
        writes = [
            *writes,
            spb.MessageWrite(
                update=spb.MessageUpdate(
                    message_id=record.record_id,
                    status=status,
                    blocks_json=_blocks_json(record.blocks),
                    metadata_json=json.dumps(metadata, ensure_ascii=False).encode(),
                )
            ),
        ]
        try:
            # Never send the state service more than it accepts.
            payload, fitted = await self.context.fit_for_save(state)
        except errors.LimitReached as exc:
            await self._mark_record_failed(control, record)
            await emit(Delta(DeltaKind.ERROR, str(exc)))
            raise
        record.compactions += fitted
        compactions = [
            spb.CompactionRecord(
                messages_before=c.messages_before,
                messages_after=c.messages_after,
                tokens_before=c.tokens_before,
                tokens_after=c.tokens_after,
                summary_chars=c.summary_chars,
                reason=c.reason,
            )
            for c in record.compactions
        ]
        # Shielded: an interrupted turn still saves what it completed.
        save = asyncio.ensure_future(
            self.state.save(
                control.user_id,
                control.conversation_id,
                state,
                version,
                writes,
                compactions,
                payload=payload,
            )
        )
        try:
            await asyncio.shield(save)
        except asyncio.CancelledError:
            await save
        except errors.AgentError as exc:
            await self._mark_record_failed(control, record)
            await emit(Delta(DeltaKind.ERROR, f"保存会话状态失败：{exc}"))
            raise
        if failure is not None:
            await emit(Delta(DeltaKind.ERROR, str(failure)))
            raise failure
        outcome_name = {Finished: "finished", CardShown: "confirm", Cancelled: "cancelled"}[
            type(outcome)
        ]
        trace.get_current_span().set_attribute("agentstate.turn.outcome", outcome_name)
        log.info(
            "turn %s of conversation %s ended: %s (%d messages in context)",
            control.task_id,
            control.conversation_id,
            outcome_name,
            len(state.context),
        )
        return outcome

    @staticmethod
    async def _finish(outcome: Finished | CardShown | Cancelled, emit: Emit) -> None:
        """The last events, sent once the lease is released: a client may start the next
        turn (Confirm on a card, say) the moment it sees them."""
        await emit(outcome)
        await emit(Done())

    async def _mark_record_failed(self, control: TurnControl, record: _TurnRecord) -> None:
        with contextlib.suppress(errors.AgentError):
            await self.state.update_message(
                control.user_id,
                control.conversation_id,
                spb.MessageUpdate(
                    message_id=record.record_id,
                    status=spb.MESSAGE_STATUS_ERROR,
                    blocks_json=_blocks_json(record.blocks),
                ),
            )

    async def _apply_decision(
        self,
        control: TurnControl,
        state: AgentState,
        decision: Msg,
        record: _TurnRecord,
        emit: Emit,
    ) -> None:
        """Answer the card's pending calls: run the approved ones, deny the rest."""
        approved = {
            item["call_id"]: bool(item["approved"])
            for item in decision.metadata.get(CONFIRM_RESULTS_KEY, [])
        }
        for _, call in state.pending_calls():
            if approved.get(call.id):
                result = await self._run_tool(control, call, emit)
            else:
                result = ToolResultBlock.of_text(
                    call.id, call.name, ToolResultState.DENIED, PERMISSION_DENIED_TEXT
                )
                await emit(ToolStatus(call.id, call.name, CallStatus.DENIED, call.input))
            # The stored tool_use keeps its `asking` state; the result settles it.
            state.context.append(Msg(role=Role.TOOL, content=[result]))
            record.add(result)

    async def _react(
        self, control: TurnControl, state: AgentState, record: _TurnRecord, emit: Emit
    ) -> Finished | CardShown:
        for step in range(1, self.settings.max_steps + 1):
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
                results.append(await self._run_tool(control, call, emit, active))
            # The assistant message and its results enter the context together,
            # so a stop between steps never leaves a half-finished cycle.
            state.context.append(assistant)
            for result in results:
                state.context.append(Msg(role=Role.TOOL, content=[result]))
                record.add(result)
            if asking:
                return await self._show_card(state, assistant, asking, record, emit)
        text = "这个问题需要的步骤太多，我先停在这里。"
        state.context.append(Msg(role=Role.ASSISTANT, content=[TextBlock(text)]))
        record.add(TextBlock(text))
        await emit(Delta(DeltaKind.RESPONSE, text))
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
        self, control: TurnControl, state: AgentState, record: _TurnRecord, emit: Emit
    ) -> Msg:
        tools = self.tools.specs(active_skills(state.context))
        report = await self.context.prepare(state, tools)
        CONTEXT_SECONDS.record(
            report.trim_seconds + report.compact_seconds,
            {"trimmed": report.trimmed > 0, "compacted": bool(report.compactions)},
        )
        if report.compactions:
            record.compactions += report.compactions
            tools = self.tools.specs(active_skills(state.context))  # a handbook may be gone
            await emit(Hint("早前的对话已压缩成摘要，完整记录仍可在历史里查看。"))
        # Middlewares get a copy: what they change is never stored.
        context = copy.deepcopy(state.context)
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
                elif isinstance(event, Usage):
                    usage = {
                        "input_tokens": event.input_tokens,
                        "output_tokens": event.output_tokens,
                    }
                    span.set_attribute("gen_ai.usage.input_tokens", event.input_tokens)
                    span.set_attribute("gen_ai.usage.output_tokens", event.output_tokens)
            span.set_attribute("agentstate.model.tool_calls", len(calls))
        content: list[Block] = []
        if thinking:
            content.append(ThinkingBlock("".join(thinking)))
        if text:
            content.append(TextBlock("".join(text)))
        for call in calls:
            content.append(ToolUseBlock(call.id, call.name, dict(call.arguments)))
        for block in content:
            record.add(block)
        return Msg(role=Role.ASSISTANT, content=content, usage=usage)

    async def _run_tool(
        self,
        control: TurnControl,
        call: ToolUseBlock,
        emit: Emit,
        active: set[str] | None = None,
    ) -> ToolResultBlock:
        """Run one call. `active`: the skills in context, when offering matters (a
        call the user approved on a card runs even if its handbook was compacted since)."""
        with tracer().start_as_current_span("tool.call") as span:
            span.set_attributes({"gen_ai.tool.name": call.name, "gen_ai.tool.call.id": call.id})
            result = await self._run_tool_traced(control, call, emit, active)
            span.set_attribute("agentstate.tool.outcome", result.state.value)
            return result

    async def _run_tool_traced(
        self,
        control: TurnControl,
        call: ToolUseBlock,
        emit: Emit,
        active: set[str] | None,
    ) -> ToolResultBlock:
        await emit(ToolStatus(call.id, call.name, CallStatus.RUNNING, call.input))
        tool = self.tools.get(call.name)
        if tool is None:
            text, ok = f"没有名为 {call.name} 的工具。", False
        elif active is not None and tool.skill is not None and tool.skill not in active:
            text = f"工具 {call.name} 现在不可用：先用 load_skill 加载手册 {tool.skill}。"
            ok = False
        else:
            try:
                arguments = check_arguments(tool.spec, call.input)
                output = await tool.run(
                    arguments, ToolContext(control.user_id, control.conversation_id, call.id)
                )
                text, ok = output.text, output.ok
            except ArgumentError as exc:
                text, ok = f"参数错误：{exc}", False
            except Exception as exc:  # a tool's bug must not kill the turn
                log.exception("tool %s failed", call.name)
                text, ok = f"工具出错：{exc}", False
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
        state: AgentState,
        assistant: Msg,
        asking: list[ToolUseBlock],
        record: _TurnRecord,
        emit: Emit,
    ) -> CardShown:
        expires = _now() + timedelta(seconds=self.settings.card_ttl_seconds)
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
        title = calls[0].title if len(calls) == 1 else f"{len(calls)} 个操作需要确认"
        card = {
            "record_id": record.record_id,
            "title": title,
            "expires_at": expires.isoformat(),
            "status": "pending",
            "calls": [
                {"call_id": c.call_id, "name": c.name, "title": c.title, "fields": c.fields}
                for c in calls
            ],
        }
        assistant.metadata[CARD_METADATA_KEY] = card
        return CardShown(record.record_id, title, calls, expires, card)
