"""The turn runner: one Chat or Confirm turn, from start to saved state.

A turn is two state calls when nothing goes wrong. BeginTurn takes the
conversation's run lease, appends the turn's records and loads the state (a load
failure ends the turn: never start fresh over a state that exists); the ReAct
loop runs; EndTurn saves it compare-and-set on the version it loaded, together with
the turn's record writes, and releases the lease. What EndTurn carries is a delta,
only what the turn changed, when this replica holds that version's parts (the
baseline), else the whole state (persistence.py).
Knows nothing of gRPC or SQL: state goes through a StatePort, the model through
a ChatModel.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span

from agentstate.agent_service import errors
from agentstate.agent_service.agent_state import AgentState, Msg, Role, TextBlock
from agentstate.agent_service.context.manager import ContextManager
from agentstate.agent_service.events import (
    Cancelled,
    CardShown,
    Delta,
    DeltaKind,
    Done,
    Emit,
    Finished,
    Hint,
    Meta,
    TurnEvent,
)
from agentstate.agent_service.middleware import DEFAULT_MIDDLEWARES, ContextMiddleware
from agentstate.agent_service.model.base import ChatModel, ModelError
from agentstate.agent_service.records import LoadedTurn
from agentstate.agent_service.runtime import cards, texts
from agentstate.agent_service.runtime.cards import CardStatus
from agentstate.agent_service.runtime.deltas import Baseline, CachedState, baseline_of
from agentstate.agent_service.runtime.lease import LeaseSettings, TurnLeases
from agentstate.agent_service.runtime.live import LiveJournal
from agentstate.agent_service.runtime.loop import ReactLoop
from agentstate.agent_service.runtime.persistence import (
    ERROR_METADATA_KEY,
    TurnRecord,
    TurnSaver,
)
from agentstate.agent_service.runtime.port import StatePort
from agentstate.agent_service.telemetry import CONFIRMATIONS, RUNNING_TURNS, user_attribute
from agentstate.agent_service.tools.registry import ToolRegistry
from agentstate.agent_service.turns import TurnControl, TurnRegistry, TurnStopped
from agentstate.client.types import (
    MessageRole,
    MessageStatus,
    MessageWrite,
    NewMessage,
    NoOpenCard,
    OpenCard,
    TurnRequest,
)
from agentstate.common.telemetry import tracer

log = logging.getLogger(__name__)

MAX_QUESTION_CHARS = 8000

Outcome = Finished | CardShown | Cancelled


@dataclass(frozen=True)
class RuntimeSettings:
    lease: LeaseSettings = field(default_factory=LeaseSettings)
    card_ttl_seconds: float = 900.0
    max_steps: int = 8
    trace_user_id: str = "hash"  # how spans carry the end user: hash, plain or omit


@dataclass(frozen=True)
class _Before:
    """What a Chat turn changes in the state before its first model step."""

    reply_id: str
    cur_iter: int
    unchanged: bool  # nothing else changed (no expired card settled, no flag cleared)


def _check_id(value: str, what: str) -> None:
    """Ids the state service generates are positive decimal 64-bit integers; saying so
    here keeps the state service's own field names out of the caller's message."""
    if not value.isdecimal() or not value.isascii() or not 0 < int(value) < 2**63:
        raise errors.InvalidInput(texts.BAD_ID.format(what=what, value=value[:40]))


def _begun_on_timeline(
    record: TurnRecord, began: float, control: TurnControl, version: int
) -> None:
    """The turn's timeline starts when BeginTurn was sent (lease, records, state load)."""
    timeline = record.timeline
    timeline.started_at -= timedelta(seconds=timeline.started - began)
    timeline.started = began
    timeline.add(
        "begin",
        "BeginTurn: run lease taken, records appended, state loaded",
        began,
        task_id=control.task_id,
        version=version,
    )


def _model_failure_text(exc: ModelError) -> str:
    """The sentence the user sees (the ERROR event and the ERROR record)."""
    cause = exc.cause
    if cause == "timeout":
        return texts.MODEL_FAILED_TIMEOUT
    if cause == "connection":
        return texts.MODEL_FAILED_UNREACHABLE
    if cause == "http_429" or cause.startswith("http_5"):
        return texts.MODEL_FAILED_BUSY if cause == "http_429" else texts.MODEL_FAILED_OTHER
    if cause in ("http_401", "http_403", "http_404"):
        return texts.MODEL_FAILED_CONFIG
    if cause in ("bad_response", "empty_response", "stream_error", "tool_call"):
        return texts.MODEL_FAILED_BAD_REPLY
    return texts.MODEL_FAILED_OTHER


class TurnRunner:
    def __init__(
        self,
        *,
        state: StatePort,
        model: ChatModel,
        tools: ToolRegistry,
        settings: RuntimeSettings,
        registry: TurnRegistry,
        context: ContextManager,
        system_prompt: str,  # the profile's (agent_service/profile.py)
        middlewares: tuple[ContextMiddleware, ...] = DEFAULT_MIDDLEWARES,
    ) -> None:
        self.state = state
        self.context = context
        self.settings = settings
        self.registry = registry
        self.leases = TurnLeases(state, settings.lease, registry)
        self.loop = ReactLoop(
            model=model,
            tools=tools,
            context=context,
            middlewares=middlewares,
            system_prompt=system_prompt,
            max_steps=settings.max_steps,
            card_ttl=timedelta(seconds=settings.card_ttl_seconds),
        )
        self.saver = TurnSaver(state, context)
        self.cache = self.saver.cache

    def _held(self, user_id: str, conversation_id: str) -> CachedState | None:
        """This replica's copy of the conversation's last saved state, taken out for
        the turn (it changes it in place; the save puts the new one back)."""
        return self.cache.take(user_id, conversation_id) if conversation_id else None

    @staticmethod
    def _loaded(
        begun: LoadedTurn, held: CachedState | None
    ) -> tuple[AgentState | None, Baseline | None]:
        """The turn's state and what its save compares with: the held copy when the
        state service said it is current, else the loaded state."""
        if begun.payload_omitted:
            if held is None:  # never start from a fresh state over one that exists
                raise errors.InternalError("the state service omitted a state this turn lacks")
            return held.state, held.baseline
        if begun.state is None:
            return None, None
        return begun.state, baseline_of(begun.state, begun.version)

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

    def _request(self, user_id: str, conversation_id: str, **fields: Any) -> TurnRequest:
        lease = self.leases.settings
        return TurnRequest(
            user_id=user_id,
            conversation_id=conversation_id,
            holder=lease.holder,
            ttl_ms=lease.ttl_ms,
            max_user_leases=lease.max_turns_per_user,
            **fields,
        )

    async def chat(self, user_id: str, conversation_id: str, question: str, emit: Emit) -> None:
        with self._turn_span("Chat", user_id, conversation_id):
            await self._chat(user_id, conversation_id, question, emit)

    async def _chat(self, user_id: str, conversation_id: str, question: str, emit: Emit) -> None:
        question = question.strip()
        if not question:
            raise errors.InvalidInput(texts.QUESTION_EMPTY)
        if len(question) > MAX_QUESTION_CHARS:
            raise errors.InvalidInput(texts.QUESTION_TOO_LONG.format(limit=MAX_QUESTION_CHARS))
        if "\x00" in question:
            raise errors.InvalidInput(texts.QUESTION_HAS_NUL)
        self.leases.ensure_accepting()
        held = self._held(user_id, conversation_id)
        # The question's record and the reply's (STREAMING until saved) are appended
        # when the turn starts: their ids are known before the loop runs.
        request = self._request(
            user_id,
            conversation_id,
            cached_version=held.baseline.version if held else None,
            title=" ".join(question.split())[:40],
            new_records=(
                NewMessage(MessageRole.USER, blocks=[TextBlock(question).to_json()]),
                NewMessage(MessageRole.ASSISTANT, status=MessageStatus.STREAMING),
            ),
            guard=NoOpenCard(),
        )
        began = time.monotonic()
        async with contextlib.AsyncExitStack() as stack:
            try:
                control, begun = await stack.enter_async_context(self.leases.turn(request))
            except errors.CardPending as exc:
                # A card is open: a new question may only settle it if it has expired.
                await self._refuse_unless_expired(user_id, conversation_id, exc.message_id)
                retry = replace(request, guard=OpenCard(exc.message_id))
                control, begun = await stack.enter_async_context(self.leases.turn(retry))
            conversation_id = begun.conversation_id
            loaded, baseline = self._loaded(begun, held)
            state = loaded or AgentState(session_id=conversation_id, user_id=user_id)
            state_changed = state.shutdown_interrupted
            hints = self._recover_interrupted(state, control)
            writes: list[MessageWrite] = []
            waiting = cards.waiting_calls(state)
            if waiting is not None:
                if not waiting.expired(cards.now()):  # the record and the state disagree
                    assert waiting.card is not None
                    raise errors.CardPending(
                        texts.CARD_PENDING.format(message_id=waiting.card.record_id),
                        waiting.card.record_id,
                    )
                writes += cards.settle_expired(state, waiting)
                hints.append(texts.HINT_EXPIRED_CARD_SETTLED)
            record = TurnRecord(begun.record_ids[1])
            _begun_on_timeline(record, began, control, begun.version)
            await emit(Meta(conversation_id, control.task_id, begun.conversation_created))
            for hint in hints:
                await emit(Hint(hint))
            # What a model failure before any finished step rolls back to.
            before: _Before | None = _Before(
                reply_id=state.reply_id,
                cur_iter=state.cur_iter,
                unchanged=not writes and not state_changed,
            )
            last = state.context[-1] if state.context else None
            if last is not None and last.role is Role.USER and last.text == question:
                # The same question again after a turn that left it unanswered (it was
                # stopped): the model must not read it twice in a row.
                before = None
            else:
                # A new question is one user message holding only its text.
                last = Msg(role=Role.USER, name="user", content=[TextBlock(question)])
                state.context.append(last)
            state.reply_id = control.task_id
            outcome = await self._run_and_save(
                control,
                state,
                begun.version,
                record,
                writes,
                emit,
                question=(last, before) if before is not None else None,
                baseline=baseline,
            )
        await self._finish(outcome, emit)

    async def _refuse_unless_expired(
        self, user_id: str, conversation_id: str, message_id: str
    ) -> None:
        """CardPending unless the open card `message_id` has expired (a rare path: one
        more state call, before anything is written)."""
        loaded = await self.state.load(user_id, conversation_id)
        waiting = cards.waiting_calls(loaded.state) if loaded.state else None
        if waiting is not None and waiting.is_card(message_id) and not waiting.expired(cards.now()):
            raise errors.CardPending(texts.CARD_PENDING.format(message_id=message_id), message_id)

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
            raise errors.InvalidInput(texts.MESSAGE_ID_REQUIRED)
        if not conversation_id:
            raise errors.InvalidInput(texts.CONVERSATION_ID_REQUIRED)
        _check_id(message_id, "message_id")
        _check_id(conversation_id, "conversation_id")
        self.leases.ensure_accepting()
        held = self._held(user_id, conversation_id)
        # The card's record must still await confirmation: a card is answered once.
        request = self._request(
            user_id,
            conversation_id,
            cached_version=held.baseline.version if held else None,
            new_records=(NewMessage(MessageRole.ASSISTANT, status=MessageStatus.STREAMING),),
            guard=OpenCard(message_id),
        )
        began = time.monotonic()
        async with contextlib.AsyncExitStack() as stack:
            try:
                control, begun = await stack.enter_async_context(self.leases.turn(request))
            except errors.Conflict as exc:
                # "Already handled", unless the message never was a card (one more
                # state call, on this refusal only). A running turn is another Conflict.
                if isinstance(exc, errors.CardAlreadyHandled) and not await self._was_card(
                    user_id, conversation_id, message_id
                ):
                    raise errors.InvalidInput(
                        texts.NOT_A_CARD.format(message_id=message_id), reason="NOT_A_CARD"
                    ) from None
                raise
            record = TurnRecord(begun.record_ids[0])
            _begun_on_timeline(record, began, control, begun.version)
            state, baseline = self._loaded(begun, held)
            waiting = cards.waiting_calls(state) if state else None
            if state is None or waiting is None or not waiting.is_card(message_id):
                # The record awaits confirmation but the state has no such card: refuse,
                # and leave the reply record this turn opened saying it failed.
                await self.saver.mark_failed(control, record, texts.CARD_HANDLED_RECORD)
                raise errors.Conflict(texts.CARD_ALREADY_HANDLED.format(message_id=message_id))
            card = waiting.card
            assert card is not None
            hints = self._recover_interrupted(state, control)
            if waiting.expired(cards.now()):
                CONFIRMATIONS.add(1, {"decision": CardStatus.EXPIRED.value})
                # The reply record this turn opened says what happened.
                record.add(TextBlock(texts.EXPIRED_CARD))
                settled = cards.settle_expired(state, waiting)
                await self.saver.save(
                    control, state, begun.version, record, settled, baseline=baseline
                )
                raise errors.Conflict(
                    texts.CARD_EXPIRED.format(
                        message_id=message_id, expires_at=card.expires_at.isoformat()
                    )
                )
            decision = cards.decision_message(waiting, approved)
            await emit(Meta(begun.conversation_id, control.task_id, False))
            for hint in hints:
                await emit(Hint(hint))
            answered = card.settled(CardStatus.APPROVED if approved else CardStatus.DENIED)
            CONFIRMATIONS.add(1, {"decision": answered.status.value})
            state.reply_id = control.task_id
            outcome = await self._run_and_save(
                control,
                state,
                begun.version,
                record,
                [],
                emit,
                decision=decision,
                card=(answered, waiting.message),
                baseline=baseline,
            )
        await self._finish(outcome, emit)

    async def _was_card(self, user_id: str, conversation_id: str, message_id: str) -> bool:
        """Whether the record `message_id` shows (or showed) a confirmation card."""
        try:
            record = await self.state.get_message(user_id, conversation_id, message_id)
        except errors.AgentError:
            return True  # cannot tell: keep the state service's answer
        try:
            metadata = json.loads(record.metadata_json or b"{}")
        except ValueError:
            return True
        return isinstance(metadata, dict) and isinstance(metadata.get("card"), dict)

    async def stop(self, user_id: str, task_id: str) -> str:
        """Ask a running turn to stop; returns its conversation id."""
        lease = await self.state.request_stop(user_id, task_id)
        local = self.registry.get(task_id)
        if local is not None:
            local.request_stop(texts.STOPPED_BY_USER)
        return lease.conversation_id

    # ------------------------------------------------------------- the turn

    def _recover_interrupted(self, state: AgentState, control: TurnControl) -> list[str]:
        hints = []
        if state.shutdown_interrupted:
            state.shutdown_interrupted = False
            hints.append(texts.HINT_RESUMED_AFTER_SHUTDOWN)
        if control.repaired_records:
            hints.append(texts.HINT_DEAD_TURN_REPAIRED)
        return hints

    async def _run_and_save(
        self,
        control: TurnControl,
        state: AgentState,
        version: int,
        record: TurnRecord,
        writes: list[MessageWrite],
        emit: Emit,
        *,
        decision: Msg | None = None,
        card: tuple[cards.Card, Msg] | None = None,
        question: tuple[Msg, _Before] | None = None,
        baseline: Baseline | None = None,
    ) -> Outcome:
        """Run the loop; save whatever it completed, whatever way it ends; return the outcome.

        A model failure leaves the finished steps (tool cycles, a card's answers) saved
        and the failed step's partial answer in the ERROR record only; when it failed
        before any step finished, the question is taken back out and the state stays
        as it was before the turn (docs/architecture.md, "What a turn leaves behind")."""
        outcome: Outcome
        status = MessageStatus.NORMAL
        metadata: dict[str, Any] = {}
        failure: errors.AgentError | None = None
        # The events so far, on the reply record, for a page that attaches mid-turn.
        journal = LiveJournal(
            self.state, control.user_id, control.conversation_id, record.record_id, control.task_id
        )
        journal.start()
        try:
            try:
                journaled = journal.wrap(emit)

                async def live(event: TurnEvent) -> None:
                    record.timeline.observe(event)
                    await journaled(event)

                if decision is not None:
                    await self.loop.answer_card(control, state, decision, record, live)
                outcome = await self.loop.run(control, state, record, live)
            finally:
                await journal.close()  # before any record write of this turn's end
            if isinstance(outcome, CardShown):
                status = MessageStatus.AWAITING_CONFIRM
                metadata = {"card": outcome.card}
        except (TurnStopped, asyncio.CancelledError) as exc:
            reason = control.stop_reason or texts.INTERRUPTED
            if isinstance(exc, asyncio.CancelledError):
                control.request_stop(texts.SHUTTING_DOWN, shutdown=True)
                reason = control.stop_reason or reason
            state.shutdown_interrupted = control.shutdown
            status = MessageStatus.INTERRUPTED
            outcome = Cancelled(record.record_id, reason)
        except ModelError as exc:
            failure = self._model_failed(control, state, exc)
            shown = _model_failure_text(exc)
            status = MessageStatus.ERROR
            metadata = {ERROR_METADATA_KEY: shown}
            outcome = Cancelled(record.record_id, str(failure))
            if question is not None and state.context and state.context[-1] is question[0]:
                # Nothing finished since the question: take it back out, so the next
                # turn's context does not hold it twice in a row (the record keeps it).
                before = question[1]
                state.context.pop()
                state.reply_id, state.cur_iter = before.reply_id, before.cur_iter
                if before.unchanged:
                    # The stored state stays exactly as it was (version included).
                    await self.saver.mark_failed(control, record, shown)
                    await emit(Delta(DeltaKind.ERROR, shown))
                    raise failure from None
        if card is not None and not state.pending_calls():
            # Every call of the card answered: its record is settled, with outcomes.
            writes = [*writes, cards.answered(card[0], state, card[1])]
        elif decision is not None:
            writes = []  # interrupted before every call was answered: the card stays open
        await self.saver.save(
            control,
            state,
            version,
            record,
            writes,
            status=status,
            metadata=metadata,
            emit=emit,
            baseline=baseline,
        )
        if failure is not None:
            await emit(Delta(DeltaKind.ERROR, metadata[ERROR_METADATA_KEY]))
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

    def _model_failed(
        self, control: TurnControl, state: AgentState, exc: ModelError
    ) -> errors.AgentError:
        """Log the failed turn (one line) and make the caller's error: what happened,
        without endpoint, model or setting names, which go to the log and ErrorInfo."""
        log.warning(
            "turn %s of conversation %s failed: the model call failed (%s) after %d attempts: %s",
            control.task_id,
            control.conversation_id,
            exc.cause,
            exc.attempts,
            exc,
            extra={
                "conversation_id": control.conversation_id,
                "task_id": control.task_id,
                "cause": exc.cause,
                "attempts": exc.attempts,
                "model_step": state.cur_iter,
            },
        )
        trace.get_current_span().set_attribute("agentstate.turn.outcome", "error:model")
        return errors.Unavailable(
            texts.MODEL_FAILED.format(error=exc.public),
            reason="MODEL_FAILED",
            metadata={
                "cause": exc.cause,
                "attempts": str(exc.attempts),
                "detail": str(exc),
                "task_id": control.task_id,
            },
        )

    @staticmethod
    async def _finish(outcome: Outcome, emit: Emit) -> None:
        """The last events, sent once the lease is released: a client may start the next
        turn (Confirm on a card, say) the moment it sees them."""
        await emit(outcome)
        await emit(Done())
