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
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
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
from agent_service.records import (
    BegunTurn,
    CompactionNote,
    NewRecord,
    NoOpenCard,
    OpenCard,
    RecordRole,
    RecordStatus,
    RecordUpdate,
    RecordWrite,
    TurnRequest,
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

log = logging.getLogger(__name__)

MAX_QUESTION_CHARS = 8000
# How many recent records to look at when repairing a turn that never finished.
REPAIR_WINDOW = 20
CARD_METADATA_KEY = "confirm"
CONFIRM_RESULTS_KEY = "confirm_results"
EXPIRED_CARD_TEXT = "确认卡片已过期，操作没有执行。"
STOPPED_TEXT = "这一轮被中断，操作没有执行。"


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


def _card_pending_text(message_id: str) -> str:
    return (
        f"confirmation card {message_id} is still pending: "
        "answer it with Confirm before asking something new"
    )


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
        system_prompt: str,  # the profile's (agent_service/profile.py)
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
        if "\x00" in question:
            raise errors.InvalidInput("question must not contain NUL characters")
        self._ensure_accepting()
        # The question's record and the reply's (STREAMING until saved) are appended
        # when the turn starts: their ids are known before the loop runs.
        request = TurnRequest(
            user_id=user_id,
            conversation_id=conversation_id,
            title=" ".join(question.split())[:40],
            holder=self.settings.holder,
            ttl_ms=self.settings.lease_ttl_ms,
            max_user_leases=self.settings.max_turns_per_user,
            new_records=(
                NewRecord(RecordRole.USER, blocks=[TextBlock(question).to_json()]),
                NewRecord(RecordRole.ASSISTANT, status=RecordStatus.STREAMING),
            ),
            guard=NoOpenCard(),
        )
        async with contextlib.AsyncExitStack() as stack:
            try:
                control, begun = await stack.enter_async_context(self._lease(request))
            except errors.CardPending as exc:
                # A card is open: a new question may only settle it if it has expired.
                await self._refuse_unless_expired(user_id, conversation_id, exc.message_id)
                retry = replace(request, guard=OpenCard(exc.message_id))
                control, begun = await stack.enter_async_context(self._lease(retry))
            conversation_id = begun.conversation_id
            state = begun.state or AgentState(session_id=conversation_id, user_id=user_id)
            hints = self._recover_interrupted(state, control)
            writes: list[RecordWrite] = []
            pending = state.pending_calls()
            if pending:
                card_msg = pending[0][0]
                card = _card_of(card_msg)
                if not _card_expired(card, _now()):  # the record and the state disagree
                    raise errors.Conflict(_card_pending_text(str(card["record_id"])))
                writes += self._settle_expired(state, card_msg)
                hints.append("上一张确认卡片已过期，其中的操作没有执行。")
            record = _TurnRecord(begun.record_ids[1])
            await emit(Meta(conversation_id, control.task_id, begun.conversation_created))
            for hint in hints:
                await emit(Hint(hint))
            # A new question is one user message holding only its text.
            state.context.append(Msg(role=Role.USER, name="user", content=[TextBlock(question)]))
            state.reply_id = control.task_id
            outcome = await self._run_and_save(control, state, begun.version, record, writes, emit)
        await self._finish(outcome, emit)

    async def _refuse_unless_expired(
        self, user_id: str, conversation_id: str, message_id: str
    ) -> None:
        """Conflict unless the open card `message_id` has expired (a rare path: one more
        state call, before anything is written)."""
        loaded = await self.state.load(user_id, conversation_id)
        pending = loaded.state.pending_calls() if loaded.state else []
        card = _card_of(pending[0][0]) if pending else {}
        if card.get("record_id") == message_id and not _card_expired(card, _now()):
            raise errors.CardPending(_card_pending_text(message_id), message_id)

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
        if not conversation_id:
            raise errors.InvalidInput("conversation_id is required")
        self._ensure_accepting()
        # The card's record must still await confirmation: a card is answered once.
        request = TurnRequest(
            user_id=user_id,
            conversation_id=conversation_id,
            holder=self.settings.holder,
            ttl_ms=self.settings.lease_ttl_ms,
            max_user_leases=self.settings.max_turns_per_user,
            new_records=(NewRecord(RecordRole.ASSISTANT, status=RecordStatus.STREAMING),),
            guard=OpenCard(message_id),
        )
        async with self._lease(request) as (control, begun):
            record = _TurnRecord(begun.record_ids[0])
            state = begun.state
            pending = state.pending_calls() if state else []
            card_msg = pending[0][0] if pending else None
            card = _card_of(card_msg) if card_msg else {}
            if state is None or card_msg is None or card.get("record_id") != message_id:
                # The record awaits confirmation but the state has no such card: refuse,
                # and leave the reply record this turn opened saying why.
                await self._mark_record_failed(control, record)
                raise errors.Conflict(f"confirmation card {message_id} was already handled")
            hints = self._recover_interrupted(state, control)
            if _card_expired(card, _now()):
                CONFIRMATIONS.add(1, {"decision": "expired"})
                # The reply record this turn opened says what happened.
                record.add(TextBlock(EXPIRED_CARD_TEXT))
                settled = self._settle_expired(state, card_msg)
                await self._save(control, state, begun.version, record, settled, {})
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
            await emit(Meta(begun.conversation_id, control.task_id, False))
            for hint in hints:
                await emit(Hint(hint))
            card["status"] = "approved" if approved else "denied"
            CONFIRMATIONS.add(1, {"decision": card["status"]})
            writes: list[RecordWrite] = [
                RecordUpdate(
                    message_id=message_id,
                    status=RecordStatus.NORMAL,
                    metadata={"card": card},
                    expected_status=RecordStatus.AWAITING_CONFIRM,
                )
            ]
            state.reply_id = control.task_id
            outcome = await self._run_and_save(
                control, state, begun.version, record, writes, emit, decision=decision
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
    async def _lease(self, request: TurnRequest) -> AsyncIterator[tuple[TurnControl, BegunTurn]]:
        """Start the turn (one state call: lease, records, state), keep its lease alive
        while it runs, and release it at the end if the turn's save did not."""
        self._ensure_accepting()
        try:
            begun = await self.state.begin_turn(request)
        except errors.Conflict as exc:
            if not isinstance(exc, errors.CardPending):
                LEASE_CONFLICTS.add(1)
            raise
        control = TurnControl(request.user_id, begun.conversation_id, begun.task_id)
        control.repaired_records = begun.interrupted_records
        if begun.interrupted_records:
            log.warning(
                "conversation %s: marked %d records of a turn that never finished as interrupted",
                begun.conversation_id,
                begun.interrupted_records,
            )
        span = trace.get_current_span()
        span.set_attribute("agentstate.conversation_id", begun.conversation_id)
        span.set_attribute("agentstate.task_id", control.task_id)
        task = asyncio.current_task()
        assert task is not None
        self.registry.add(control, task)
        heartbeat = asyncio.create_task(self._heartbeat(control))
        try:
            yield control, begun
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            if not control.released:
                try:
                    await asyncio.shield(self.state.release_lease(request.user_id, control.task_id))
                except errors.AgentError as exc:
                    # It lapses by itself after its ttl.
                    log.warning("could not release lease of task %s: %s", control.task_id, exc)

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

    def _recover_interrupted(self, state: AgentState, control: TurnControl) -> list[str]:
        hints = []
        if state.shutdown_interrupted:
            state.shutdown_interrupted = False
            hints.append("上一轮因服务停机被中断，已从保存的状态继续。")
        if control.repaired_records:
            hints.append("上一轮没有正常结束（服务异常退出），它未完成的回复已标记为中断。")
        return hints

    def _settle_expired(self, state: AgentState, card_msg: Msg) -> list[RecordWrite]:
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
            RecordUpdate(
                message_id=str(card["record_id"]),
                status=RecordStatus.NORMAL,
                metadata={"card": card},
                expected_status=RecordStatus.AWAITING_CONFIRM,
            )
        ]

    async def _run_and_save(
        self,
        control: TurnControl,
        state: AgentState,
        version: int,
        record: _TurnRecord,
        writes: list[RecordWrite],
        emit: Emit,
        *,
        decision: Msg | None = None,
    ) -> Finished | CardShown | Cancelled:
        """Run the loop; save whatever it completed, whatever way it ends; return the outcome."""
        outcome: Finished | CardShown | Cancelled
        status = RecordStatus.NORMAL
        metadata: dict[str, Any] = {}
        failure: errors.AgentError | None = None
        try:
            if decision is not None:
                await self._apply_decision(control, state, decision, record, emit)
            outcome = await self._react(control, state, record, emit)
            if isinstance(outcome, CardShown):
                status = RecordStatus.AWAITING_CONFIRM
                metadata = {"card": outcome.card}
        except (TurnStopped, asyncio.CancelledError) as exc:
            reason = control.stop_reason or "interrupted"
            if isinstance(exc, asyncio.CancelledError):
                control.request_stop("the service is shutting down", shutdown=True)
                reason = control.stop_reason or reason
            state.shutdown_interrupted = control.shutdown
            status = RecordStatus.INTERRUPTED
            outcome = Cancelled(record.record_id, reason)
        except ModelError as exc:
            failure = errors.Unavailable(f"the model failed: {exc}")
            status = RecordStatus.ERROR
            outcome = Cancelled(record.record_id, str(failure))
        if decision is not None and state.pending_calls():
            writes = []  # interrupted before every call was answered: the card stays open
        await self._save(control, state, version, record, writes, metadata, status, emit)
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

    async def _save(
        self,
        control: TurnControl,
        state: AgentState,
        version: int,
        record: _TurnRecord,
        writes: list[RecordWrite],
        metadata: dict[str, Any],
        status: RecordStatus = RecordStatus.NORMAL,
        emit: Emit | None = None,
    ) -> None:
        """End the turn: save the state with the version it loaded, the writes and this
        turn's reply record, and release the lease, in one state call. On failure the
        reply record is marked ERROR, the client is told (`emit`) and the stored state is
        left as it was."""
        writes = [
            *writes,
            RecordUpdate(
                message_id=record.record_id, status=status, blocks=record.blocks, metadata=metadata
            ),
        ]
        try:
            # Never send the state service more than it accepts.
            payload, fitted = await self.context.fit_for_save(state)
        except errors.LimitReached as exc:
            await self._mark_record_failed(control, record)
            if emit is not None:
                await emit(Delta(DeltaKind.ERROR, str(exc)))
            raise
        record.compactions += fitted
        compactions = [
            CompactionNote(
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
            self.state.end_turn(
                control.user_id,
                control.conversation_id,
                control.task_id,
                payload=payload,
                message_count=len(state.context),
                expected_version=version,
                writes=writes,
                compactions=compactions,
            )
        )
        try:
            ended = await asyncio.shield(save)
        except asyncio.CancelledError:
            ended = await save
        except errors.AgentError as exc:
            await self._mark_record_failed(control, record)
            if emit is not None:
                await emit(Delta(DeltaKind.ERROR, f"保存会话状态失败：{exc}"))
            raise
        control.released = ended.lease_released

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
                RecordUpdate(
                    message_id=record.record_id, status=RecordStatus.ERROR, blocks=record.blocks
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
