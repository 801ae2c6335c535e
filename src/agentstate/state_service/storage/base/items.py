"""The items capability's interface (OpenAI Agents sessions, ADK events and scoped state)."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from datetime import datetime

from agentstate.state_service.domain import (
    AppendedEvent,
    AppendedItems,
    ClearedItems,
    EventAppend,
    ItemsPage,
    NewItem,
    PoppedItem,
    ScopedStates,
)


class ItemStore(abc.ABC):
    """Ordered conversation items, events, and app- and user-scoped state."""

    @abc.abstractmethod
    async def append_items(
        self,
        *,
        user_id: str,
        conversation_id: int,
        items: Sequence[NewItem],
        expected_revision: int | None,
    ) -> AppendedItems:
        """Append items in order, under the conversation's lock, in one transaction.

        NotFound (conversation absent), RevisionConflict (`expected_revision` set and
        not the current revision). Nothing changes on any error."""

    @abc.abstractmethod
    async def list_items(
        self,
        *,
        user_id: str,
        conversation_id: int,
        last_n: int | None,
        min_item_time: datetime | None,
        page_size: int,
        after_seq: int | None,
        state_key: str = "",
        scoped_app: str = "",
    ) -> ItemsPage:
        """Oldest first: the items at or after `min_item_time`, only the newest
        `last_n` of them when set, from after `after_seq`. NotFound when absent.
        With `state_key`, the page's `state` is the conversation's state under it; with
        `scoped_app`, its `scoped` are that app's states: read with the items, at the
        same point in time (an ADK session in one read)."""

    @abc.abstractmethod
    async def pop_item(
        self, *, user_id: str, conversation_id: int, expected_revision: int | None
    ) -> PoppedItem:
        """Remove and return the newest item (None when empty). Errors as append_items."""

    @abc.abstractmethod
    async def clear_items(self, *, user_id: str, conversation_id: int) -> ClearedItems:
        """Remove every item of the conversation. NotFound when absent."""

    @abc.abstractmethod
    async def get_scoped_state(self, *, user_id: str, app_name: str) -> ScopedStates:
        """The app-scoped and the user-scoped state (None where none was written)."""

    @abc.abstractmethod
    async def append_event(
        self, *, user_id: str, conversation_id: int, event: EventAppend
    ) -> AppendedEvent:
        """In one transaction: check the revision, append the item (if any), merge the
        deltas into the conversation state, the app- and the user-scoped state.
        Errors as append_items. Nothing changes on any error."""
