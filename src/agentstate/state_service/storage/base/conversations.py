"""The conversations aggregate's interface."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from datetime import datetime

from agentstate.state_service.domain import (
    Conversation,
    DeleteCounts,
    Page,
    ResolvedConversation,
    TimeToLive,
)


class ConversationStore(abc.ABC):
    """Conversations, their external keys, and their deletion with everything they own."""

    @abc.abstractmethod
    async def create_conversation(
        self,
        *,
        user_id: str,
        title: str,
        external_key: str = "",
        labels: Mapping[str, str] | None = None,
        ttl: TimeToLive | None = None,
    ) -> Conversation:
        """AlreadyExists when `external_key` ("" = none) is another conversation's."""

    @abc.abstractmethod
    async def resolve_conversation(
        self,
        *,
        user_id: str,
        external_key: str,
        create_if_missing: bool,
        title: str,
        labels: Mapping[str, str] | None = None,
        ttl: TimeToLive | None = None,
    ) -> ResolvedConversation:
        """The user's conversation with `external_key`; created (atomically: concurrent
        callers get one conversation) when absent and `create_if_missing`, else NotFound.
        `labels` and `ttl` are those of a created one."""

    @abc.abstractmethod
    async def get_conversation(self, *, user_id: str, conversation_id: int) -> Conversation: ...

    @abc.abstractmethod
    async def list_conversations(
        self, *, user_id: str, page_size: int, before_id: int | None
    ) -> Page[Conversation]:
        """Newest first; `before_id` is the last id of the previous page."""

    @abc.abstractmethod
    async def rename_conversation(
        self, *, user_id: str, conversation_id: int, title: str
    ) -> Conversation: ...

    @abc.abstractmethod
    async def delete_conversations(
        self, *, user_id: str, conversation_ids: Sequence[int]
    ) -> DeleteCounts:
        """Delete conversations, their messages and states in one transaction.

        All or nothing: NotFound naming the first absent id, and nothing deleted.
        """

    @abc.abstractmethod
    async def purge_inactive(self, *, before: datetime, batch_size: int = 500) -> DeleteCounts:
        """Retention: delete every conversation (with its messages, states, leases and
        compaction records) untouched since `before`, except those running a turn.
        Each batch is one transaction."""
