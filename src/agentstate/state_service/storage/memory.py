"""An in-memory store for demos and fast tests. Data dies with the process.

It keeps the PostgreSQL store's rules, including which JSON PostgreSQL's JSONB
rejects, and returns states as jsonb prints them (domain.jsonb_text), so the shared
behavioural suite holds for both and GetState answers with the same bytes. One asyncio lock
makes every operation atomic; each write validates everything before it
changes anything, so a failed call leaves no trace.
"""

from __future__ import annotations

import asyncio
import json
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
    ResolvedConversation,
    StateDelta,
    StoredState,
    TurnStart,
    UpsertResult,
    VersionConflict,
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


@dataclass
class _CheckpointRow:
    checkpoint: d.NewCheckpoint
    create_time: datetime


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
        # Checkpoints (issue 15), per conversation: (namespace, checkpoint id) -> row,
        # (namespace, channel, version) -> value, (namespace, checkpoint id, task, idx) -> write.
        self._checkpoints: dict[int, dict[tuple[str, str], _CheckpointRow]] = {}
        self._channel_values: dict[int, dict[tuple[str, str, str], d.ChannelValue]] = {}
        self._checkpoint_writes: dict[int, dict[tuple[str, str, str, int], d.CheckpointWrite]] = {}
        # Conversation items (oldest first) and each conversation's item revision.
        self._items: dict[int, list[d.ConversationItem]] = {}
        self._item_revisions: dict[int, int] = {}
        # (app_name, user_id) -> scoped state; user_id "" is the app-scoped one.
        self._scoped: dict[tuple[str, str], _StateRow] = {}
        self._keys: dict[tuple[str, str], int] = {}  # (user, external key) -> conversation

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

    async def create_conversation(
        self, *, user_id: str, title: str, external_key: str = ""
    ) -> Conversation:
        async with self._lock:
            if external_key and (user_id, external_key) in self._keys:
                raise d.external_key_taken(external_key)
            return self._create(user_id, title, external_key)

    def _create(self, user_id: str, title: str, external_key: str) -> Conversation:
        now = _now()
        conversation = Conversation(self._ids.next_id(), user_id, title, now, now, external_key)
        self._conversations[conversation.conversation_id] = conversation
        if external_key:
            self._keys[(user_id, external_key)] = conversation.conversation_id
        return conversation

    async def resolve_conversation(
        self, *, user_id: str, external_key: str, create_if_missing: bool, title: str
    ) -> ResolvedConversation:
        async with self._lock:
            existing = self._keys.get((user_id, external_key))
            if existing is not None:
                return ResolvedConversation(self._conversations[existing], created=False)
            if not create_if_missing:
                raise d.external_key_not_found(external_key)
            return ResolvedConversation(self._create(user_id, title, external_key), created=True)

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
            gone = self._conversations.pop(conversation_id)
            if gone.external_key:
                del self._keys[(gone.user_id, gone.external_key)]
            self._leases.pop(conversation_id, None)
            self._last_task.pop(conversation_id, None)
            self._compactions.pop(conversation_id, None)
            self._items.pop(conversation_id, None)
            self._item_revisions.pop(conversation_id, None)
            self._checkpoints.pop(conversation_id, None)
            self._channel_values.pop(conversation_id, None)
            self._checkpoint_writes.pop(conversation_id, None)
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

    async def get_lease(self, *, user_id: str, conversation_id: int) -> Lease | None:
        async with self._lock:
            self._conversation(user_id, conversation_id)
            return self._leases.get(conversation_id)

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
            raise d.lease_held(held)
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
            acquire_time=_now(),
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

    # ---------------------------------------------------- checkpoints (issue 15)

    def _head(self, conversation_id: int, namespace: str) -> str:
        ids = [cid for ns, cid in self._checkpoints.get(conversation_id, {}) if ns == namespace]
        return max(ids, default="")

    async def put_checkpoint(
        self,
        *,
        user_id: str,
        conversation_id: int,
        checkpoint: d.NewCheckpoint,
        expected_head: str | None,
    ) -> datetime:
        async with self._lock:
            conversation = self._conversation(user_id, conversation_id)
            d.check_json_depth(checkpoint.metadata_json, "metadata_json")
            d.check_jsonb(checkpoint.metadata_json, dict, "metadata_json")
            rows = self._checkpoints.setdefault(conversation_id, {})
            key = (checkpoint.namespace, checkpoint.checkpoint_id)
            if expected_head is not None and key not in rows:
                head = self._head(conversation_id, checkpoint.namespace)
                if head != expected_head:
                    raise d.CheckpointConflict(checkpoint.namespace, expected_head, head)
            values = self._channel_values.setdefault(conversation_id, {})
            for value in checkpoint.new_values:
                values.setdefault((checkpoint.namespace, value.channel, value.version), value)
            now = _now()
            rows[key] = _CheckpointRow(checkpoint, now)
            self._touch(conversation)
            return now

    def _stored(self, conversation_id: int, row: _CheckpointRow) -> d.StoredCheckpoint:
        cp = row.checkpoint
        values = self._channel_values.get(conversation_id, {})
        channel_values = [
            values[(cp.namespace, channel, version)]
            for channel, version in cp.channel_versions.items()
            if (cp.namespace, channel, version) in values
        ]
        writes = sorted(
            (
                w
                for (ns, cid, _, _), w in self._checkpoint_writes.get(conversation_id, {}).items()
                if ns == cp.namespace and cid == cp.checkpoint_id
            ),
            key=lambda w: (w.task_path, w.task_id, w.idx),
        )
        return d.StoredCheckpoint(
            conversation_id=conversation_id,
            namespace=cp.namespace,
            checkpoint_id=cp.checkpoint_id,
            parent_checkpoint_id=cp.parent_checkpoint_id,
            checkpoint_type=cp.checkpoint_type,
            checkpoint=cp.checkpoint,
            metadata_json=cp.metadata_json,
            channel_versions=dict(cp.channel_versions),
            channel_values=channel_values,
            pending_writes=writes,
            create_time=row.create_time,
        )

    async def get_checkpoint(
        self, *, user_id: str, conversation_id: int, namespace: str, checkpoint_id: str | None
    ) -> d.StoredCheckpoint | None:
        async with self._lock:
            self._conversation(user_id, conversation_id)
            wanted = checkpoint_id or self._head(conversation_id, namespace)
            row = self._checkpoints.get(conversation_id, {}).get((namespace, wanted))
            return None if row is None else self._stored(conversation_id, row)

    async def list_checkpoints(
        self,
        *,
        user_id: str,
        conversation_id: int,
        namespace: str | None,
        metadata_filter: bytes | None,
        before_checkpoint_id: str | None,
        page_size: int,
        after: tuple[str, str] | None,
    ) -> Page[d.StoredCheckpoint]:
        async with self._lock:
            self._conversation(user_id, conversation_id)
            wanted = json.loads(metadata_filter) if metadata_filter else None
            chosen = []
            for (ns, cid), row in self._checkpoints.get(conversation_id, {}).items():
                if namespace is not None and ns != namespace:
                    continue
                if before_checkpoint_id is not None and cid >= before_checkpoint_id:
                    continue
                if after is not None and (cid, ns) >= after:
                    continue
                if wanted is not None and not d.json_contains(
                    json.loads(row.checkpoint.metadata_json), wanted
                ):
                    continue
                chosen.append(((cid, ns), row))
            chosen.sort(key=lambda item: item[0], reverse=True)
            page = [self._stored(conversation_id, row) for _, row in chosen[:page_size]]
            token = ""
            if len(chosen) > page_size:
                last = page[-1]
                token = d.checkpoint_page_token(last.checkpoint_id, last.namespace)
            return Page(page, token)

    async def put_checkpoint_writes(
        self,
        *,
        user_id: str,
        conversation_id: int,
        namespace: str,
        checkpoint_id: str,
        writes: Sequence[d.CheckpointWrite],
    ) -> int:
        async with self._lock:
            self._conversation(user_id, conversation_id)
            stored = self._checkpoint_writes.setdefault(conversation_id, {})
            count = 0
            for write in writes:
                key = (namespace, checkpoint_id, write.task_id, write.idx)
                if key in stored and write.idx >= 0:
                    continue  # a retried write: the first one stays
                stored[key] = write
                count += 1
            return count

    def _drop_checkpoints(self, conversation_id: int, doomed: set[tuple[str, str]]) -> None:
        """Remove checkpoints, the writes and values no remaining checkpoint has."""
        rows = self._checkpoints.get(conversation_id, {})
        for key in doomed:
            del rows[key]
        writes = self._checkpoint_writes.get(conversation_id, {})
        for wkey in [k for k in writes if (k[0], k[1]) not in rows]:
            del writes[wkey]
        used = {
            (row.checkpoint.namespace, channel, version)
            for row in rows.values()
            for channel, version in row.checkpoint.channel_versions.items()
        }
        values = self._channel_values.get(conversation_id, {})
        for vkey in [k for k in values if k not in used]:
            del values[vkey]

    async def delete_checkpoints_for_runs(self, *, user_id: str, run_ids: Sequence[str]) -> int:
        async with self._lock:
            runs = set(run_ids)
            deleted = 0
            for conversation_id, rows in self._checkpoints.items():
                if self._conversations[conversation_id].user_id != user_id:
                    continue
                doomed = {k for k, row in rows.items() if row.checkpoint.run_id() in runs}
                if doomed:
                    self._drop_checkpoints(conversation_id, doomed)
                    deleted += len(doomed)
            return deleted

    async def copy_checkpoints(
        self, *, user_id: str, source_conversation_id: int, target_conversation_id: int
    ) -> int:
        async with self._lock:
            self._conversation(user_id, source_conversation_id)
            target = self._conversation(user_id, target_conversation_id)
            if self._checkpoints.get(target_conversation_id):
                raise d.target_has_checkpoints(target_conversation_id)
            rows = self._checkpoints.get(source_conversation_id, {})
            self._checkpoints[target_conversation_id] = {
                k: _CheckpointRow(row.checkpoint, row.create_time) for k, row in rows.items()
            }
            self._channel_values[target_conversation_id] = dict(
                self._channel_values.get(source_conversation_id, {})
            )
            self._checkpoint_writes[target_conversation_id] = dict(
                self._checkpoint_writes.get(source_conversation_id, {})
            )
            self._touch(target)
            return len(rows)

    async def prune_checkpoints(
        self, *, user_id: str, conversation_ids: Sequence[int], strategy: d.PruneStrategy
    ) -> int:
        async with self._lock:
            wanted = sorted(set(conversation_ids))
            for conversation_id in wanted:
                try:
                    self._conversation(user_id, conversation_id)
                except NotFound:
                    raise NotFound(
                        f"conversation {conversation_id} not found; nothing was pruned"
                    ) from None
            deleted = 0
            for conversation_id in wanted:
                rows = self._checkpoints.get(conversation_id, {})
                doomed = set(rows)
                if strategy is d.PruneStrategy.KEEP_LATEST:
                    for namespace in {ns for ns, _ in rows}:
                        doomed.discard((namespace, self._head(conversation_id, namespace)))
                self._drop_checkpoints(conversation_id, doomed)
                deleted += len(doomed)
            return deleted

    # ------------------------------------- conversation items, scoped state

    def _lock_items(self, user_id: str, conversation_id: int, expected_revision: int | None) -> int:
        conversation = self._conversation(user_id, conversation_id)
        revision = self._item_revisions.get(conversation_id, 0)
        if expected_revision is not None and expected_revision != revision:
            raise d.RevisionConflict(expected_revision, revision)
        self._touch(conversation)
        return revision

    def _new_item(
        self, conversation_id: int, seq: int, item: d.NewItem, now: datetime
    ) -> d.ConversationItem:
        return d.ConversationItem(
            conversation_id=conversation_id,
            seq=seq,
            item_json=item.item_json,
            item_time=item.item_time or now,
            create_time=now,
        )

    async def append_items(
        self,
        *,
        user_id: str,
        conversation_id: int,
        items: Sequence[d.NewItem],
        expected_revision: int | None,
    ) -> d.AppendedItems:
        async with self._lock:
            revision = self._lock_items(user_id, conversation_id, expected_revision)
            now = _now()
            added = [
                self._new_item(conversation_id, revision + i, item, now)
                for i, item in enumerate(items, start=1)
            ]
            self._items.setdefault(conversation_id, []).extend(added)
            self._item_revisions[conversation_id] = revision + len(items)
            return d.AppendedItems(added, revision + len(items))

    async def list_items(
        self,
        *,
        user_id: str,
        conversation_id: int,
        last_n: int | None,
        min_item_time: datetime | None,
        page_size: int,
        after_seq: int | None,
    ) -> d.ItemsPage:
        async with self._lock:
            conversation = self._conversation(user_id, conversation_id)
            selected = [
                i
                for i in self._items.get(conversation_id, [])
                if min_item_time is None or i.item_time >= min_item_time
            ]
            if last_n is not None:
                selected = selected[-last_n:] if last_n else []
            if after_seq is not None:
                selected = [i for i in selected if i.seq > after_seq]
            items = selected[:page_size]
            token = str(items[-1].seq) if len(selected) > page_size else ""
            return d.ItemsPage(
                items,
                token,
                self._item_revisions.get(conversation_id, 0),
                conversation.update_time,
            )

    async def pop_item(
        self, *, user_id: str, conversation_id: int, expected_revision: int | None
    ) -> d.PoppedItem:
        async with self._lock:
            revision = self._lock_items(user_id, conversation_id, expected_revision)
            items = self._items.get(conversation_id, [])
            if not items:
                return d.PoppedItem(None, revision)
            self._item_revisions[conversation_id] = revision + 1
            return d.PoppedItem(items.pop(), revision + 1)

    async def clear_items(self, *, user_id: str, conversation_id: int) -> d.ClearedItems:
        async with self._lock:
            revision = self._lock_items(user_id, conversation_id, None)
            deleted = len(self._items.pop(conversation_id, []))
            if deleted:
                revision += 1
                self._item_revisions[conversation_id] = revision
            return d.ClearedItems(deleted, revision)

    async def get_scoped_state(self, *, user_id: str, app_name: str) -> d.ScopedStates:
        async with self._lock:
            rows = [self._scoped.get((app_name, who)) for who in ("", user_id)]
            app, user = (
                StoredState(r.payload, r.version, r.update_time) if r else None for r in rows
            )
            return d.ScopedStates(app=app, user=user)

    @staticmethod
    def _merged(row: _StateRow | None, delta: bytes, now: datetime) -> _StateRow:
        payload = json.loads(row.payload) if row else {}
        payload.update(json.loads(delta))
        encoded = json.dumps(payload, ensure_ascii=False).encode()
        return _StateRow(encoded, (row.version if row else 0) + 1, now)

    async def append_event(
        self, *, user_id: str, conversation_id: int, event: d.EventAppend
    ) -> d.AppendedEvent:
        async with self._lock:
            revision = self._lock_items(user_id, conversation_id, event.expected_revision) + 1
            now = _now()
            self._item_revisions[conversation_id] = revision
            item = None
            if event.item is not None:
                item = self._new_item(conversation_id, revision, event.item, now)
                self._items.setdefault(conversation_id, []).append(item)
            key = (conversation_id, event.state_key)
            if event.state_delta is not None:
                self._states[key] = self._merged(self._states.get(key), event.state_delta, now)
            for who, delta in (("", event.app_delta), (user_id, event.user_delta)):
                if delta is not None:
                    scoped = (event.app_name, who)
                    self._scoped[scoped] = self._merged(self._scoped.get(scoped), delta, now)
            state = self._states.get(key)
            return d.AppendedEvent(item, revision, state.version if state else 0)
