"""The in-memory store's tables, one asyncio lock over all of them, and its id generator."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from agentstate.state_service import domain as d
from agentstate.state_service.domain import (
    Compaction,
    Conversation,
    DeleteCounts,
    Lease,
    MessageRecord,
    MessageWrite,
    NewMessage,
    NotFound,
)

EPOCH_MS = 1288834974657  # the same id layout as the database's agentstate_next_id()


class IdGenerator:
    """Time-ordered 64-bit ids: milliseconds in the high bits, a counter in the low 22."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0

    def next_id(self) -> int:
        with self._lock:
            candidate = (int(time.time() * 1000) - EPOCH_MS) << 22
            self._last = max(candidate, self._last + 1)
            return self._last


@dataclass
class StateRow:
    payload: bytes
    version: int
    update_time: datetime
    # Stored split, as PostgreSQL splits a state whose "context" is an array (a whole
    # save or a delta); a merged state (AppendEvent) is its members, whatever it holds.
    split: bool = False


@dataclass
class CheckpointRow:
    checkpoint: d.NewCheckpoint
    create_time: datetime


def utc_now() -> datetime:
    return datetime.now(UTC)


class MemoryTables:
    """Every aggregate's rows. Each write validates everything before it changes anything,
    under the one lock, so a failed call leaves no trace."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._ids = IdGenerator()
        self._conversations: dict[int, Conversation] = {}
        self._messages: dict[int, dict[int, MessageRecord]] = {}  # conversation -> id -> record
        self._states: dict[tuple[int, str], StateRow] = {}
        self._leases: dict[int, Lease] = {}  # conversation -> lease
        # conversation -> the task its lease was last granted to: EndTurn's fence
        # (see migration 6 and _fence_turn).
        self._last_task: dict[int, int] = {}
        self._compactions: dict[int, list[Compaction]] = {}
        # Checkpoints (issue 15), per conversation: (namespace, checkpoint id) -> row,
        # (namespace, channel, version) -> value, (namespace, checkpoint id, task, idx) -> write.
        self._checkpoints: dict[int, dict[tuple[str, str], CheckpointRow]] = {}
        self._channel_values: dict[int, dict[tuple[str, str, str], d.ChannelValue]] = {}
        self._checkpoint_writes: dict[int, dict[tuple[str, str, str, int], d.CheckpointWrite]] = {}
        # Conversation items (oldest first) and each conversation's item revision.
        self._items: dict[int, list[d.ConversationItem]] = {}
        self._item_revisions: dict[int, int] = {}
        # (app_name, user_id) -> scoped state; user_id "" is the app-scoped one.
        self._scoped: dict[tuple[str, str], StateRow] = {}
        self._keys: dict[tuple[str, str], int] = {}  # (user, external key) -> conversation
        # Erasures (issue 23): receipts by id, the running one of each user hash, and the
        # users whose erase runs (no new row of theirs is accepted).
        self._erasures: dict[int, d.ErasureReceipt] = {}
        self._erasure_heartbeats: dict[int, float] = {}
        self._erasure_users: dict[int, str] = {}  # erasure -> user hash
        self._fences: dict[str, int] = {}  # user -> running erasure

    def _check_fence(self, user_id: str) -> None:
        """UserBeingErased when an erase of this user runs (a new row would outlive it)."""
        erasure = self._fences.get(user_id)
        if erasure is not None:
            raise d.user_being_erased(erasure)

    def _conversation(self, user_id: str, conversation_id: int) -> Conversation:
        conversation = self._conversations.get(conversation_id)
        if conversation is None or conversation.user_id != user_id:
            raise NotFound(f"conversation {conversation_id} not found")
        return conversation

    def _with_status(self, conversation: Conversation) -> Conversation:
        """The conversation as the server sees it now: status, last turn, and the expiry
        of a time to live renewed by each write (as migration 13's trigger)."""
        now = utc_now()
        records = self._messages.get(conversation.conversation_id, {})
        newest = records[max(records)] if records else None
        lease = self._leases.get(conversation.conversation_id)
        if lease is not None and lease.expire_time > now:
            status = d.ConversationStatus.RUNNING
        elif any(m.status is d.MessageStatus.AWAITING_CONFIRM for m in records.values()):
            status = d.ConversationStatus.AWAITING_CONFIRMATION
        elif newest is not None and newest.status is d.MessageStatus.ERROR:
            status = d.ConversationStatus.FAILED
        else:
            status = d.ConversationStatus.IDLE
        expire_time = conversation.expire_time
        ttl = conversation.ttl
        if ttl is not None and ttl.policy is d.TtlPolicy.RENEW_ON_WRITE:
            expire_time = conversation.update_time + timedelta(seconds=ttl.seconds)
        return replace(
            conversation,
            status=status,
            last_turn_time=None if newest is None else newest.update_time,
            expire_time=expire_time,
        )

    def _touch(self, conversation: Conversation) -> None:
        self._conversations[conversation.conversation_id] = replace(
            conversation, update_time=utc_now()
        )

    def _check_lease(
        self, user_id: str, conversation_id: int, max_user_leases: int
    ) -> Lease | None:
        """Refuse if the lease cannot be taken; return the lapsed lease it would replace."""
        now = utc_now()
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

    def _lease_of_task(self, user_id: str, task_id: int) -> Lease | None:
        for lease in self._leases.values():
            if lease.task_id == task_id and lease.user_id == user_id:
                return lease
        return None

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

    def _new_lease(self, user_id: str, conversation_id: int, holder: str, ttl_ms: int) -> Lease:
        lease = Lease(
            task_id=self._ids.next_id(),
            conversation_id=conversation_id,
            user_id=user_id,
            holder=holder,
            expire_time=utc_now() + timedelta(milliseconds=ttl_ms),
            stop_requested=False,
            acquire_time=utc_now(),
        )
        self._leases[conversation_id] = lease
        self._last_task[conversation_id] = lease.task_id
        return lease

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
                now = utc_now()
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
                    update_time=utc_now(),
                )
            staged[record.message_id] = record
            written.append(record)
        return written
