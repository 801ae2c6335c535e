"""The message records aggregate's interface."""

from __future__ import annotations

import abc

from agentstate.state_service.domain import (
    Compaction,
    MessageRecord,
    MessageUpdate,
    MessageWrite,
    NewMessage,
    Page,
)


class MessageStore(abc.ABC):
    """Message records for UI replay, and compaction records."""

    @abc.abstractmethod
    async def write_message(
        self, *, user_id: str, conversation_id: int, write: MessageWrite
    ) -> MessageRecord:
        """Append a record (NewMessage) or change one (MessageUpdate; FailedPrecondition
        when its `expected_status` is set and differs), under the conversation's lock."""

    async def append_message(
        self, *, user_id: str, conversation_id: int, message: NewMessage
    ) -> MessageRecord:
        return await self.write_message(
            user_id=user_id, conversation_id=conversation_id, write=message
        )

    async def update_message(
        self, *, user_id: str, conversation_id: int, update: MessageUpdate
    ) -> MessageRecord:
        return await self.write_message(
            user_id=user_id, conversation_id=conversation_id, write=update
        )

    @abc.abstractmethod
    async def list_messages(
        self,
        *,
        user_id: str,
        conversation_id: int,
        page_size: int,
        after_id: int | None,
        newest_first: bool = False,
    ) -> Page[MessageRecord]:
        """Oldest first (or newest first); `after_id` is the previous page's last id.

        NotFound when the conversation is absent."""

    @abc.abstractmethod
    async def list_compactions(self, *, user_id: str, conversation_id: int) -> list[Compaction]:
        """Oldest first; NotFound when the conversation is absent."""

    @abc.abstractmethod
    async def get_message(
        self, *, user_id: str, conversation_id: int, message_id: int
    ) -> MessageRecord: ...
