"""Ending a turn: what the turn changed in the state (or the whole state, on a first
save), its record writes and its compaction notes in one state call, with the version
the turn loaded (compare-and-set), releasing the lease. The saved state is kept in
this replica's StateCache, so the conversation's next turn here loads nothing.

An interrupted turn still saves what it completed (the save is shielded from
cancellation). When the save fails, the turn's reply record says ERROR and the
stored state is left as it was: never half a turn.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from agentstate.agent_service import errors
from agentstate.agent_service.agent_state import AgentState, Block, ToolResultBlock
from agentstate.agent_service.context.manager import CompactionDone, ContextManager
from agentstate.agent_service.events import Delta, DeltaKind, Emit
from agentstate.agent_service.runtime import outcomes, texts
from agentstate.agent_service.runtime.deltas import (
    Baseline,
    CachedState,
    StateCache,
    baseline_of,
    change_since,
    encode_parts,
)
from agentstate.agent_service.runtime.port import StatePort
from agentstate.agent_service.runtime.timeline import TIMELINE_METADATA_KEY, Timeline
from agentstate.agent_service.turns import TurnControl
from agentstate.client.types import CompactionNote, MessageStatus, MessageUpdate, MessageWrite

log = logging.getLogger(__name__)

# On an ERROR record: the sentence a page shows for what went wrong.
ERROR_METADATA_KEY = "error"


@dataclass
class TurnRecord:
    """This turn's reply record (what the user sees) and what context management did.

    It holds the blocks themselves, written out when the turn is saved: a tool call's
    state and outcome are the ones it has then, not the ones it had when the model
    sent it (runtime/outcomes.py)."""

    record_id: str
    blocks: list[Block] = field(default_factory=list)
    compactions: list[CompactionDone] = field(default_factory=list)
    timeline: Timeline = field(default_factory=Timeline)

    def add(self, block: Block) -> None:
        self.blocks.append(block)

    def to_json(self, state: AgentState | None = None) -> list[dict[str, Any]]:
        results = outcomes.results_of(state.context) if state is not None else {}
        for block in self.blocks:  # this turn's own results (a failed turn drops them)
            if isinstance(block, ToolResultBlock):
                results.setdefault(block.id, block)
        return outcomes.record_blocks(self.blocks, results)


class TurnSaver:
    def __init__(
        self, state: StatePort, context: ContextManager, cache: StateCache | None = None
    ) -> None:
        self._state = state
        self._context = context
        self.cache = cache if cache is not None else StateCache()

    async def save(
        self,
        control: TurnControl,
        state: AgentState,
        version: int,
        record: TurnRecord,
        writes: list[MessageWrite],
        *,
        status: MessageStatus = MessageStatus.NORMAL,
        metadata: dict[str, Any] | None = None,
        emit: Emit | None = None,
        baseline: Baseline | None = None,
    ) -> None:
        """Save the turn: what changed since `baseline` (the loaded version's parts),
        or the whole state when there is none. On failure the record is marked ERROR,
        the client is told (`emit`) and the error raised; the stored state is the one
        before the turn."""
        encoded = encode_parts(state)  # each message once: the delta and the size
        if encoded.size > self._context.settings.max_state_bytes:
            try:
                # Never send the state service more than it accepts.
                _, fitted = await self._context.fit_for_save(state)
            except errors.LimitReached:
                await self.mark_failed(control, record, texts.STATE_TOO_LARGE_RECORD)
                if emit is not None:  # the user reads what the record shows; the caller the status
                    await emit(Delta(DeltaKind.ERROR, texts.STATE_TOO_LARGE_RECORD))
                raise
            record.compactions += fitted
            encoded = encode_parts(state)
        change = None
        payload = None
        if baseline is not None and baseline.version == version and version > 0:
            change = change_since(baseline, state, encoded)
        else:
            payload = state.encode()  # a first save, or nothing to compare with
        # The save is the timeline's last entry (its own duration is known only after it).
        record.timeline.add(
            "save",
            "EndTurn: state saved, records written, lease released",
            expected_version=version,
            mode="delta" if change is not None else "whole",
            state_bytes=encoded.size,
            messages=len(state.context),
        )
        writes = [
            *writes,
            MessageUpdate(
                message_id=record.record_id,
                status=status,
                blocks=record.to_json(state),
                metadata={**(metadata or {}), TIMELINE_METADATA_KEY: record.timeline.to_json()},
            ),
        ]
        save = asyncio.ensure_future(
            self._state.end_turn(
                control.user_id,
                control.conversation_id,
                control.task_id,
                payload=payload,
                change=change,
                message_count=len(state.context),
                expected_version=version,
                writes=writes,
                compactions=[_note(c) for c in record.compactions],
            )
        )
        try:
            ended = await asyncio.shield(save)
        except asyncio.CancelledError:
            ended = await save  # interrupted: the save goes on regardless
        except errors.AgentError:
            await self.mark_failed(control, record, texts.SAVE_FAILED_RECORD)
            if emit is not None:
                await emit(Delta(DeltaKind.ERROR, texts.SAVE_FAILED_RECORD))
            raise
        control.released = ended.lease_released
        self.cache.put(
            control.user_id,
            control.conversation_id,
            CachedState(state, baseline_of(state, ended.version, encoded)),
        )

    async def mark_failed(self, control: TurnControl, record: TurnRecord, error: str) -> None:
        """The reply record says ERROR, keeps what the user saw and `error`, the
        sentence a page shows for it (metadata "error"); the state is not written.
        When even that write fails (the state service is gone too), the turn's own
        error still reaches the caller: this one is logged, and the record stays
        STREAMING until the conversation's next turn marks it INTERRUPTED."""
        try:
            await self._state.update_message(
                control.user_id,
                control.conversation_id,
                MessageUpdate(
                    message_id=record.record_id,
                    status=MessageStatus.ERROR,
                    blocks=record.to_json(),
                    metadata={ERROR_METADATA_KEY: error},
                ),
            )
        except errors.AgentError as exc:
            log.warning(
                "turn %s of conversation %s: its reply record %s could not be marked ERROR "
                "(%s: %s)",
                control.task_id,
                control.conversation_id,
                record.record_id,
                type(exc).__name__,
                exc,
                extra={
                    "conversation_id": control.conversation_id,
                    "task_id": control.task_id,
                    "record_id": record.record_id,
                },
            )


def _note(done: CompactionDone) -> CompactionNote:
    return CompactionNote(
        messages_before=done.messages_before,
        messages_after=done.messages_after,
        tokens_before=done.tokens_before,
        tokens_after=done.tokens_after,
        summary_chars=done.summary_chars,
        reason=done.reason,
    )
