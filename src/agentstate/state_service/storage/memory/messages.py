"""Message and compaction records in memory."""

from __future__ import annotations

from agentstate.state_service.domain import (
    Compaction,
    MessageRecord,
    MessageWrite,
    NotFound,
    Page,
)
from agentstate.state_service.storage.base.messages import MessageStore
from agentstate.state_service.storage.memory.tables import (
    MemoryTables,
)


class MemoryMessages(MemoryTables, MessageStore):
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
