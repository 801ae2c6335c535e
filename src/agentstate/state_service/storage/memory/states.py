"""Agent states and turns in memory."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from agentstate.state_service import domain as d
from agentstate.state_service.domain import (
    BegunTurn,
    Compaction,
    Conversation,
    MessageStatus,
    MessageWrite,
    NotFound,
    RequireAwaiting,
    RequireNoneAwaiting,
    StateDelta,
    StoredState,
    TurnStart,
    UpsertResult,
    VersionConflict,
)
from agentstate.state_service.storage.base.states import AgentStateStore
from agentstate.state_service.storage.memory.tables import (
    MemoryTables,
    StateRow,
    utc_now,
)


class MemoryStates(MemoryTables, AgentStateStore):
    async def get_state(self, *, user_id: str, conversation_id: int, state_key: str) -> StoredState:
        async with self._lock:
            self._conversation(user_id, conversation_id)
            row = self._states.get((conversation_id, state_key))
            if row is None:
                raise NotFound(
                    f"conversation {conversation_id} has no state {state_key!r} yet", "state"
                )
            return StoredState(row.payload, row.version, row.update_time)

    async def save_state(
        self,
        *,
        user_id: str,
        conversation_id: int,
        state_key: str,
        payload: bytes | None,
        expected_version: int | None,
        message_writes: Sequence[MessageWrite] = (),
        compactions: Sequence[Compaction] = (),
        task_id: int | None = None,
        delta: StateDelta | None = None,
        max_state_bytes: int | None = None,
    ) -> UpsertResult:
        # Validate everything, then apply: a failure leaves no trace.
        if delta is not None:
            d.check_state_delta(delta)  # first, as the PostgreSQL store does
        async with self._lock:
            conversation = self._conversation(user_id, conversation_id)
            if task_id is not None:
                self._fence_turn(conversation_id, task_id)
            held = self._leases.get(conversation_id)
            current = self._states.get((conversation_id, state_key))
            current_version = current.version if current else 0
            if delta is None:
                if payload is None:
                    raise d.InvalidArgument("a save needs a payload or a delta")
                d.check_json_depth(payload, "payload")
                form = d.state_form(payload)
                stored, split = form.text(), form.split
                if expected_version is not None and expected_version != current_version:
                    raise VersionConflict(expected_version, current_version)
            else:
                d.check_delta_parts(delta)
                if delta.base_version != current_version or current is None:
                    raise VersionConflict(delta.base_version, current_version)
                stored = d.apply_delta(current.payload, delta, max_state_bytes, split=current.split)
                split = True
            staged = self._stage_messages(user_id, conversation_id, message_writes)
            # Everything is valid: apply.
            now = utc_now()
            row = StateRow(stored, current_version + 1, now, split)
            self._states[(conversation_id, state_key)] = row
            records = self._messages.setdefault(conversation_id, {})
            for record in staged:
                records[record.message_id] = record
            self._compactions.setdefault(conversation_id, []).extend(
                replace(c, compaction_id=self._ids.next_id(), create_time=now) for c in compactions
            )
            self._touch(conversation)
            # Past the fence a lease still there is this task's own (lapsed or not).
            released = task_id is not None and held is not None
            if released:
                del self._leases[conversation_id]
            return UpsertResult(row.version, row.update_time, staged, lease_released=released)

    async def begin_turn(
        self, *, user_id: str, conversation_id: int | None, start: TurnStart
    ) -> BegunTurn:
        async with self._lock:
            now = utc_now()
            if conversation_id is None:
                self._check_fence(user_id)
                conversation = Conversation(self._ids.next_id(), user_id, start.title, now, now)
            else:
                conversation = self._conversation(user_id, conversation_id)
            cid = conversation.conversation_id
            held = self._check_lease(user_id, cid, start.max_user_leases)
            records = self._messages.get(cid, {})
            guard = start.guard
            if isinstance(guard, RequireNoneAwaiting):
                awaiting = sorted(
                    m.message_id
                    for m in records.values()
                    if m.status is MessageStatus.AWAITING_CONFIRM
                )
                if awaiting:
                    raise d.CardPending(awaiting[0])
            elif isinstance(guard, RequireAwaiting):
                card = records.get(guard.message_id)
                if card is None:
                    raise d.message_not_found(guard.message_id, cid)
                if card.status is not MessageStatus.AWAITING_CONFIRM:
                    raise d.not_awaiting(guard.message_id, card.status.value)
            staged = self._stage_messages(user_id, cid, start.new_messages, batch="new_messages")
            # Everything is valid: apply.
            self._conversations[cid] = conversation
            self._touch(conversation)
            lease = self._new_lease(user_id, cid, start.holder, start.ttl_ms)
            interrupted = 0
            for record in list(records.values()):
                if record.status is MessageStatus.STREAMING:
                    records[record.message_id] = replace(
                        record, status=MessageStatus.INTERRUPTED, update_time=now
                    )
                    interrupted += 1
            mine = self._messages.setdefault(cid, {})
            for record in staged:
                mine[record.message_id] = record
            row = self._states.get((cid, start.state_key))
            omitted = row is not None and row.version == start.cached_version
            state = None
            if row is not None:
                state = StoredState(b"" if omitted else row.payload, row.version, row.update_time)
            return BegunTurn(
                conversation=self._conversations[cid],
                conversation_created=conversation_id is None,
                lease=lease,
                lapsed_task_id=held.task_id if held is not None else None,
                interrupted_records=interrupted,
                state=state,
                messages=staged,
                payload_omitted=omitted,
            )
