"""The data lifecycle in memory: labels and time to live, the conversation search,
expiry, and erasing a user in batches (issue 23), as the PostgreSQL store does it."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from datetime import timedelta

from agentstate.state_service import domain as d
from agentstate.state_service.domain import (
    Conversation,
    ConversationFilter,
    DeleteCounts,
    ErasureReceipt,
    LabelChange,
    Page,
)
from agentstate.state_service.storage.base.lifecycle import (
    ConversationSearch,
    EraseSettings,
    LifecycleStore,
    TtlChange,
)
from agentstate.state_service.storage.memory.tables import MemoryTables, utc_now


def _matches(c: Conversation, where: ConversationFilter) -> bool:
    return (
        (where.user_id is None or c.user_id == where.user_id)
        and c.external_key.startswith(where.key_prefix)
        and (not where.key_prefix or bool(c.external_key))
        and c.title.startswith(where.title_prefix)
        and (where.updated_after is None or c.update_time >= where.updated_after)
        and (where.updated_before is None or c.update_time < where.updated_before)
        and where.selector.matches(c.labels)
        and (not where.statuses or c.status in where.statuses)
    )


class MemoryLifecycle(MemoryTables, LifecycleStore):
    async def set_conversation_facts(
        self, *, user_id: str, conversation_id: int, labels: LabelChange, ttl: TtlChange
    ) -> Conversation:
        async with self._lock:
            conversation = self._conversation(user_id, conversation_id)
            changed = replace(
                conversation,
                labels=d.apply_label_change(conversation.labels, labels),
                update_time=utc_now(),  # a change of the conversation (as in PostgreSQL)
            )
            if ttl.clear:
                changed = replace(changed, ttl=None, expire_time=None)
            elif ttl.ttl is not None:
                changed = replace(
                    changed,
                    ttl=ttl.ttl,
                    expire_time=utc_now() + timedelta(seconds=ttl.ttl.seconds),
                )
            self._conversations[conversation_id] = changed
            return self._with_status(changed)

    async def search_conversations(
        self,
        *,
        where: ConversationFilter,
        page_size: int,
        before_id: int | None,
        include_total: bool = False,
        include_state_key: str = "",
    ) -> ConversationSearch:
        async with self._lock:
            found = sorted(
                (
                    seen
                    for c in self._conversations.values()
                    if _matches(seen := self._with_status(c), where)
                ),
                key=lambda c: c.conversation_id,
                reverse=True,
            )
            total = min(len(found), d.MAX_COUNTED_TOTAL + 1) if include_total else None
            if before_id is not None:
                found = [c for c in found if c.conversation_id < before_id]
            items = found[:page_size]
            states = {}
            if include_state_key:
                for c in items:
                    row = self._states.get((c.conversation_id, include_state_key))
                    if row is not None:
                        states[c.conversation_id] = row.payload
        token = str(items[-1].conversation_id) if len(found) > page_size else ""
        return ConversationSearch(Page(items, token), total, states)

    async def purge_expired(self, *, batch_size: int = 500) -> DeleteCounts:
        async with self._lock:
            now = utc_now()
            running = {c for c, lease in self._leases.items() if lease.expire_time > now}
            expired = [
                c.conversation_id
                for c in map(self._with_status, self._conversations.values())
                if c.expire_time is not None
                and c.expire_time < now
                and c.conversation_id not in running
            ]
            return self._delete(expired)

    async def erase_user(self, *, user_id: str, settings: EraseSettings) -> ErasureReceipt:
        hashed = d.user_hash(user_id)
        async with self._lock:
            erasure_id = self._begin_erasure(user_id, hashed, settings)
            receipt = self._erasures[erasure_id]
            if receipt.done:
                return receipt
        deadline = time.monotonic() + settings.stop_grace_seconds
        while time.monotonic() < deadline:
            async with self._lock:
                now = utc_now()
                if not any(
                    lease.user_id == user_id and lease.expire_time > now
                    for lease in self._leases.values()
                ):
                    break
            await asyncio.sleep(0.05)
        while True:
            async with self._lock:
                if not self._erase_batch(user_id, erasure_id, settings.batch_conversations):
                    return self._erasures[erasure_id]
            await asyncio.sleep(settings.pause_seconds)

    def _begin_erasure(self, user_id: str, hashed: str, settings: EraseSettings) -> int:
        """The erasure to run (new, resumed, or an earlier finished one), fence put up."""
        running = [
            e for e, h in self._erasure_users.items() if h == hashed and not self._erasures[e].done
        ]
        if running:
            erasure_id = running[0]
            heartbeat = self._erasure_heartbeats[erasure_id]
            if time.monotonic() - heartbeat < settings.stale_seconds:
                raise d.erasure_running(erasure_id)
        elif not any(c.user_id == user_id for c in self._conversations.values()) and not any(
            who == user_id for _, who in self._scoped
        ):
            done = [e for e, h in self._erasure_users.items() if h == hashed]
            if not done:
                raise d.unknown_user()
            return max(done)
        else:
            erasure_id = self._ids.next_id()
            self._erasures[erasure_id] = ErasureReceipt(
                erasure_id, False, dict.fromkeys(d.ERASED_KINDS, 0), utc_now(), None
            )
            self._erasure_users[erasure_id] = hashed
        self._erasure_heartbeats[erasure_id] = time.monotonic()
        self._fences[user_id] = erasure_id
        # Running turns are asked to stop; their next write finds no conversation.
        for lease in list(self._leases.values()):
            if lease.user_id == user_id:
                self._leases[lease.conversation_id] = replace(lease, stop_requested=True)
        return erasure_id

    def _erase_batch(self, user_id: str, erasure_id: int, batch: int) -> bool:
        """One batch; False once everything of the user is gone and the receipt is done."""
        ids = sorted(c for c, conv in self._conversations.items() if conv.user_id == user_id)
        ids = ids[:batch]
        counts = dict.fromkeys(d.ERASED_KINDS, 0)
        if ids:
            for cid in ids:
                counts["leases"] += cid in self._leases
                counts["compactions"] += len(self._compactions.get(cid, []))
                counts["items"] += len(self._items.get(cid, []))
                counts["checkpoints"] += len(self._checkpoints.get(cid, {}))
                counts["channel_values"] += len(self._channel_values.get(cid, {}))
                counts["checkpoint_writes"] += len(self._checkpoint_writes.get(cid, {}))
                counts["state_messages"] += sum(
                    len(_context_of(row.payload))
                    for (c, _), row in self._states.items()
                    if c == cid
                )
            deleted = self._delete(ids)
            counts["conversations"] += deleted.conversations
            counts["messages"] += deleted.messages
            counts["states"] += deleted.states
        else:
            for key in [k for k in self._scoped if k[1] == user_id]:
                del self._scoped[key]
                counts["scoped_states"] += 1
            self._fences.pop(user_id, None)
        old = self._erasures[erasure_id]
        self._erasures[erasure_id] = replace(
            old,
            counts={k: old.counts.get(k, 0) + counts[k] for k in d.ERASED_KINDS},
            done=not ids,
            end_time=None if ids else utc_now(),
        )
        self._erasure_heartbeats[erasure_id] = time.monotonic()
        return bool(ids)

    async def get_erasure_receipt(self, *, erasure_id: int) -> ErasureReceipt:
        async with self._lock:
            receipt = self._erasures.get(erasure_id)
            if receipt is None:
                raise d.erasure_not_found(erasure_id)
            return receipt


def _context_of(payload: bytes) -> list[object]:
    """The context messages a state holds: the rows PostgreSQL keeps them in."""

    context = json.loads(payload).get("context")
    return context if isinstance(context, list) else []
