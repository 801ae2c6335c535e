"""Conversations in memory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from agentstate.state_service import domain as d
from agentstate.state_service.domain import (
    Conversation,
    DeleteCounts,
    NotFound,
    Page,
    ResolvedConversation,
)
from agentstate.state_service.storage.base.conversations import ConversationStore
from agentstate.state_service.storage.memory.tables import (
    MemoryTables,
    utc_now,
)


class MemoryConversations(MemoryTables, ConversationStore):
    async def create_conversation(
        self,
        *,
        user_id: str,
        title: str,
        external_key: str = "",
        labels: Mapping[str, str] | None = None,
        ttl: d.TimeToLive | None = None,
    ) -> Conversation:
        async with self._lock:
            if external_key and (user_id, external_key) in self._keys:
                raise d.external_key_taken(external_key)
            return self._create(user_id, title, external_key, labels, ttl)

    def _create(
        self,
        user_id: str,
        title: str,
        external_key: str,
        labels: Mapping[str, str] | None = None,
        ttl: d.TimeToLive | None = None,
    ) -> Conversation:
        self._check_fence(user_id)
        now = utc_now()
        conversation = Conversation(
            self._ids.next_id(),
            user_id,
            title,
            now,
            now,
            external_key,
            labels=dict(labels or {}),
            ttl=ttl,
            expire_time=None if ttl is None else now + timedelta(seconds=ttl.seconds),
        )
        self._conversations[conversation.conversation_id] = conversation
        if external_key:
            self._keys[(user_id, external_key)] = conversation.conversation_id
        return conversation

    async def resolve_conversation(
        self,
        *,
        user_id: str,
        external_key: str,
        create_if_missing: bool,
        title: str,
        labels: Mapping[str, str] | None = None,
        ttl: d.TimeToLive | None = None,
    ) -> ResolvedConversation:
        async with self._lock:
            existing = self._keys.get((user_id, external_key))
            if existing is not None:
                return ResolvedConversation(
                    self._with_status(self._conversations[existing]), created=False
                )
            if not create_if_missing:
                raise d.external_key_not_found(external_key)
            return ResolvedConversation(
                self._create(user_id, title, external_key, labels, ttl), created=True
            )

    async def get_conversation(self, *, user_id: str, conversation_id: int) -> Conversation:
        async with self._lock:
            return self._with_status(self._conversation(user_id, conversation_id))

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
            items = [self._with_status(c) for c in mine[:page_size]]
        token = str(items[-1].conversation_id) if len(mine) > page_size else ""
        return Page(items, token)

    async def rename_conversation(
        self, *, user_id: str, conversation_id: int, title: str
    ) -> Conversation:
        async with self._lock:
            conversation = self._conversation(user_id, conversation_id)
            renamed = replace(conversation, title=title, update_time=utc_now())
            self._conversations[conversation_id] = renamed
            return self._with_status(renamed)

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
            now = utc_now()
            running = {c for c, lease in self._leases.items() if lease.expire_time > now}
            stale = [
                c.conversation_id
                for c in self._conversations.values()
                if c.update_time < before and c.conversation_id not in running
            ]
            return self._delete(stale)
