"""An in-memory store for demos and fast tests. Data dies with the process.

It keeps the PostgreSQL store's rules, including which JSON PostgreSQL's JSONB
rejects, and returns states as jsonb prints them (domain.jsonb_text), so the shared
behavioural suite holds for both and GetState answers with the same bytes. One asyncio lock
makes every operation atomic; each write validates everything before it
changes anything, so a failed call leaves no trace.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from agentstate.state_service import domain as d
from agentstate.state_service.domain import (
    AcquiredLease,
    BegunTurn,
    Compaction,
    Conversation,
    DeleteCounts,
    Lease,
    MessageRecord,
    MessageStatus,
    MessageWrite,
    NewMessage,
    NotFound,
    Page,
    RequireAwaiting,
    RequireNoneAwaiting,
    StateDelta,
    StoredState,
    TurnStart,
    UpsertResult,
    VersionConflict,
    lease_conflict_message,
)
from agentstate.state_service.storage.base import StateStore

_EPOCH_MS = 1288834974657  # the same id layout as the database's agentstate_next_id()


class IdGenerator:
    """Time-ordered 64-bit ids: milliseconds in the high bits, a counter in the low 22."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0

    def next_id(self) -> int:
        with self._lock:
            candidate = (int(time.time() * 1000) - _EPOCH_MS) << 22
            self._last = max(candidate, self._last + 1)
            return self._last


@dataclass
class _StateRow:
    payload: bytes
    version: int
    update_time: datetime


def _now() -> datetime:
    return datetime.now(UTC)


def _apply_delta(stored: bytes, delta: StateDelta, max_state_bytes: int | None) -> bytes:
    """The stored state (jsonb's text) after `delta`, refused as PostgreSQL's store
    refuses it (see migration 10's agentstate_save_state)."""
    state = d.parse_json(stored)
    context = state.pop("context", [])
    if not isinstance(context, list):
        raise d.context_not_array()
    if delta.drop_head > len(context):
        raise d.delta_out_of_range("drop_head", delta.drop_head, len(context))
    context = context[delta.drop_head :]
    keep = len(context) if delta.replace_from is None else delta.replace_from
    if keep > len(context):
        raise d.delta_out_of_range("replace_from", keep, len(context))
    added = []
    for index, message in enumerate(delta.messages):
        d.check_jsonb(message, object, f"delta.messages[{index}]")
        added.append(d.parse_json(message))
    if delta.fields_json is not None:
        d.check_jsonb(delta.fields_json, dict, "delta.fields_json")
        state = d.parse_json(delta.fields_json)
        if "context" in state:
            raise d.fields_name_context()
    state["context"] = context[:keep] + added
    text = d.jsonb_text(state)
    if max_state_bytes is not None and len(text) > max_state_bytes:
        raise d.state_too_large(len(text), max_state_bytes)
    return text


class MemoryStore(StateStore):
    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._ids = IdGenerator()
        self._conversations: dict[int, Conversation] = {}
        self._messages: dict[int, dict[int, MessageRecord]] = {}  # conversation -> id -> record
        self._states: dict[tuple[int, str], _StateRow] = {}
        self._leases: dict[int, Lease] = {}  # conversation -> lease
        # conversation -> the task its lease was last granted to: EndTurn's fence
        # (see migration 6 and _fence_turn).
        self._last_task: dict[int, int] = {}
        self._compactions: dict[int, list[Compaction]] = {}

    def _conversation(self, user_id: str, conversation_id: int) -> Conversation:
        conversation = self._conversations.get(conversation_id)
        if conversation is None or conversation.user_id != user_id:
            raise NotFound(f"conversation {conversation_id} not found")
        return conversation

    def _touch(self, conversation: Conversation) -> None:
        self._conversations[conversation.conversation_id] = replace(
            conversation, update_time=_now()
        )

    # ------------------------------------------------------------------ state

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
                d.check_jsonb(payload, dict, "payload")
                if expected_version is not None and expected_version != current_version:
                    raise VersionConflict(expected_version, current_version)
                stored = d.jsonb_text(d.parse_json(payload))
            else:
                d.check_state_delta(delta)
                if delta.base_version != current_version or current is None:
                    raise VersionConflict(delta.base_version, current_version)
                stored = _apply_delta(current.payload, delta, max_state_bytes)
            staged = self._stage_messages(user_id, conversation_id, message_writes)
            # Everything is valid: apply.
            now = _now()
            row = _StateRow(stored, current_version + 1, now)
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
            now = _now()
            if conversation_id is None:
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

    def _stage_messages(
        self,
        user_id: str,
        conversation_id: int,
        writes: Sequence[MessageWrite],
        *,
        batch: str | None = "message_writes",
    ) -> list[MessageRecord]:
        """Validate writes and build the records they produce, changing nothing.
        `batch`: the request field they came from (None: a single write)."""
        staged: dict[int, MessageRecord] = {}
        written: list[MessageRecord] = []
        existing = self._messages.get(conversation_id, {})
        for index, write in enumerate(writes):
            where = "message" if batch is None else f"{batch}[{index}]"
            if isinstance(write, NewMessage):
                d.check_jsonb(write.blocks_json, list, f"{where}.blocks_json")
                d.check_jsonb(write.metadata_json, dict, f"{where}.metadata_json")
                now = _now()
                record = MessageRecord(
                    message_id=self._ids.next_id(),
                    conversation_id=conversation_id,
                    user_id=user_id,
                    role=write.role,
                    blocks_json=write.blocks_json,
                    status=write.status,
                    metadata_json=write.metadata_json,
                    create_time=now,
                    update_time=now,
                )
            else:
                found = staged.get(write.message_id) or existing.get(write.message_id)
                if found is None:
                    raise d.message_not_found(write.message_id, conversation_id, where)
                if write.expected_status and found.status != write.expected_status:
                    raise d.status_mismatch(
                        where, write.message_id, found.status, write.expected_status
                    )
                if write.blocks_json is not None:
                    d.check_jsonb(write.blocks_json, list, f"{where}.blocks_json")
                if write.metadata_json is not None:
                    d.check_jsonb(write.metadata_json, dict, f"{where}.metadata_json")
                record = replace(
                    found,
                    status=write.status or found.status,
                    blocks_json=(
                        found.blocks_json if write.blocks_json is None else write.blocks_json
                    ),
                    metadata_json=(
                        found.metadata_json if write.metadata_json is None else write.metadata_json
                    ),
                    update_time=_now(),
                )
            staged[record.message_id] = record
            written.append(record)
        return written

    # ---------------------------------------------------------- conversations

    async def create_conversation(self, *, user_id: str, title: str) -> Conversation:
        async with self._lock:
            now = _now()
            conversation = Conversation(self._ids.next_id(), user_id, title, now, now)
            self._conversations[conversation.conversation_id] = conversation
            return conversation

    async def get_conversation(self, *, user_id: str, conversation_id: int) -> Conversation:
        async with self._lock:
            return self._conversation(user_id, conversation_id)

    async def list_conversations(
        self, *, user_id: str, page_size: int, before_id: int | None
    ) -> Page[Conversation]:
        async with self._lock:
            mine = sorted(
                (
                    c
                    for c in self._conversations.values()
                    if c.user_id == user_id and (before_id is None or c.conversation_id < before_id)
                ),
                key=lambda c: c.conversation_id,
                reverse=True,
            )
        items = mine[:page_size]
        token = str(items[-1].conversation_id) if len(mine) > page_size else ""
        return Page(items, token)

    async def rename_conversation(
        self, *, user_id: str, conversation_id: int, title: str
    ) -> Conversation:
        async with self._lock:
            conversation = self._conversation(user_id, conversation_id)
            renamed = replace(conversation, title=title, update_time=_now())
            self._conversations[conversation_id] = renamed
            return renamed

    async def delete_conversations(
        self, *, user_id: str, conversation_ids: Sequence[int]
    ) -> DeleteCounts:
        async with self._lock:
            wanted = sorted(set(conversation_ids))
            for conversation_id in wanted:
                try:
                    self._conversation(user_id, conversation_id)
                except NotFound:
                    raise NotFound(
                        f"conversation {conversation_id} not found; nothing was deleted"
                    ) from None
            return self._delete(wanted)

    async def purge_inactive(self, *, before: datetime, batch_size: int = 500) -> DeleteCounts:
        async with self._lock:
            now = _now()
            running = {c for c, lease in self._leases.items() if lease.expire_time > now}
            stale = [
                c.conversation_id
                for c in self._conversations.values()
                if c.update_time < before and c.conversation_id not in running
            ]
            return self._delete(stale)

    def _delete(self, wanted: Sequence[int]) -> DeleteCounts:
        """Delete conversations known to exist, with everything that hangs off them."""
        messages = states = 0
        for conversation_id in wanted:
            del self._conversations[conversation_id]
            self._leases.pop(conversation_id, None)
            self._last_task.pop(conversation_id, None)
            self._compactions.pop(conversation_id, None)
            messages += len(self._messages.pop(conversation_id, {}))
            for key in [k for k in self._states if k[0] == conversation_id]:
                del self._states[key]
                states += 1
        return DeleteCounts(conversations=len(wanted), messages=messages, states=states)

    # --------------------------------------------------------------- messages

    async def write_message(
        self, *, user_id: str, conversation_id: int, write: MessageWrite
    ) -> MessageRecord:
        async with self._lock:
            conversation = self._conversation(user_id, conversation_id)
            (record,) = self._stage_messages(user_id, conversation_id, [write], batch=None)
            self._messages.setdefault(conversation_id, {})[record.message_id] = record
            self._touch(conversation)
            return record

    async def list_messages(
        self,
        *,
        user_id: str,
        conversation_id: int,
        page_size: int,
        after_id: int | None,
        newest_first: bool = False,
    ) -> Page[MessageRecord]:
        async with self._lock:
            self._conversation(user_id, conversation_id)
            records = sorted(
                (
                    m
                    for m in self._messages.get(conversation_id, {}).values()
                    if after_id is None
                    or (m.message_id < after_id if newest_first else m.message_id > after_id)
                ),
                key=lambda m: m.message_id,
                reverse=newest_first,
            )
        items = records[:page_size]
        token = str(items[-1].message_id) if len(records) > page_size else ""
        return Page(items, token)

    async def list_compactions(self, *, user_id: str, conversation_id: int) -> list[Compaction]:
        async with self._lock:
            self._conversation(user_id, conversation_id)
            return list(self._compactions.get(conversation_id, []))

    async def get_message(
        self, *, user_id: str, conversation_id: int, message_id: int
    ) -> MessageRecord:
        async with self._lock:
            self._conversation(user_id, conversation_id)
            record = self._messages.get(conversation_id, {}).get(message_id)
            if record is None:
                raise NotFound(
                    f"message {message_id} not found in conversation {conversation_id}", "message"
                )
            return record

    # ------------------------------------------------------------ run leases

    async def acquire_lease(
        self,
        *,
        user_id: str,
        conversation_id: int,
        holder: str,
        ttl_ms: int,
        max_user_leases: int,
    ) -> AcquiredLease:
        async with self._lock:
            self._conversation(user_id, conversation_id)
            held = self._check_lease(user_id, conversation_id, max_user_leases)
            lease = self._new_lease(user_id, conversation_id, holder, ttl_ms)
            return AcquiredLease(lease, held.task_id if held is not None else None)

    def _check_lease(
        self, user_id: str, conversation_id: int, max_user_leases: int
    ) -> Lease | None:
        """Refuse if the lease cannot be taken; return the lapsed lease it would replace."""
        now = _now()
        if max_user_leases > 0:
            running = sum(
                1
                for lease in self._leases.values()
                if lease.user_id == user_id
                and lease.expire_time > now
                and lease.conversation_id != conversation_id
            )
            if running >= max_user_leases:
                raise d.user_lease_limit(running, max_user_leases)
        held = self._leases.get(conversation_id)
        if held is not None and held.expire_time > now:
            raise d.LeaseHeld(lease_conflict_message(held))
        return held

    def _fence_turn(self, conversation_id: int, task_id: int) -> None:
        """Refuse the save of a turn whose lease another task took over since.

        Only the task the lease was last granted to may end a turn: a lapsed lease
        that nobody took saves; one taken over is refused (LEASE_LOST) even when
        the newer turn has finished and the lease is free again.
        """
        last = self._last_task.get(conversation_id)
        if last is not None and last != task_id:
            raise d.lease_taken_over(task_id, last)

    def _new_lease(self, user_id: str, conversation_id: int, holder: str, ttl_ms: int) -> Lease:
        lease = Lease(
            task_id=self._ids.next_id(),
            conversation_id=conversation_id,
            user_id=user_id,
            holder=holder,
            expire_time=_now() + timedelta(milliseconds=ttl_ms),
            stop_requested=False,
        )
        self._leases[conversation_id] = lease
        self._last_task[conversation_id] = lease.task_id
        return lease

    def _lease_of_task(self, user_id: str, task_id: int) -> Lease | None:
        for lease in self._leases.values():
            if lease.task_id == task_id and lease.user_id == user_id:
                return lease
        return None

    async def renew_lease(self, *, user_id: str, task_id: int, ttl_ms: int) -> Lease:
        async with self._lock:
            lease = self._lease_of_task(user_id, task_id)
            if lease is None:
                raise d.LeaseLost(f"lease of task {task_id} was lost (released or taken over)")
            renewed = replace(lease, expire_time=_now() + timedelta(milliseconds=ttl_ms))
            self._leases[lease.conversation_id] = renewed
            return renewed

    async def release_lease(self, *, user_id: str, task_id: int) -> bool:
        async with self._lock:
            lease = self._lease_of_task(user_id, task_id)
            if lease is None:
                return False
            del self._leases[lease.conversation_id]
            return True

    async def request_stop(self, *, user_id: str, task_id: int) -> Lease:
        async with self._lock:
            lease = self._lease_of_task(user_id, task_id)
            if lease is None or lease.expire_time <= _now():
                raise NotFound(f"no running task {task_id}", "task")
            stopped = replace(lease, stop_requested=True)
            self._leases[lease.conversation_id] = stopped
            return stopped
