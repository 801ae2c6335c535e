"""Conversation items, events and scoped state in memory."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from agentstate.state_service import domain as d
from agentstate.state_service.domain import (
    StoredState,
    jsontext,
)
from agentstate.state_service.storage.base.items import ItemStore
from agentstate.state_service.storage.memory.tables import (
    MemoryTables,
    StateRow,
    utc_now,
)


class MemoryItems(MemoryTables, ItemStore):
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
            now = utc_now()
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
        state_key: str = "",
        scoped_app: str = "",
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
            state = self._states.get((conversation_id, state_key)) if state_key else None
            return d.ItemsPage(
                items,
                token,
                self._item_revisions.get(conversation_id, 0),
                conversation.update_time,
                StoredState(state.payload, state.version, state.update_time) if state else None,
                self._scoped_states(user_id, scoped_app) if scoped_app else None,
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
            return self._scoped_states(user_id, app_name)

    def _scoped_states(self, user_id: str, app_name: str) -> d.ScopedStates:
        rows = [self._scoped.get((app_name, who)) for who in ("", user_id)]
        app, user = (StoredState(r.payload, r.version, r.update_time) if r else None for r in rows)
        return d.ScopedStates(app=app, user=user)

    @staticmethod
    def _merged(row: StateRow | None, delta: d.Delta, now: datetime) -> StateRow:
        merged = jsontext.merge_text(row.payload if row else None, delta.text(), "state")
        return StateRow(merged, (row.version if row else 0) + 1, now)

    async def append_event(
        self, *, user_id: str, conversation_id: int, event: d.EventAppend
    ) -> d.AppendedEvent:
        async with self._lock:
            revision = self._lock_items(user_id, conversation_id, event.expected_revision) + 1
            if event.user_delta is not None and (event.app_name, user_id) not in self._scoped:
                self._check_fence(user_id)  # a new row of a user being erased
            key = (conversation_id, event.state_key)
            current = self._states.get(key)
            if event.state_delta is not None and current is not None and current.split:
                # As PostgreSQL's store: a split agent state is not merged into.
                raise d.state_not_mergeable(event.state_key)
            now = utc_now()
            self._item_revisions[conversation_id] = revision
            item = None
            if event.item is not None:
                item = self._new_item(conversation_id, revision, event.item, now)
                self._items.setdefault(conversation_id, []).append(item)
            if event.state_delta is not None:
                self._states[key] = self._merged(self._states.get(key), event.state_delta, now)
            for who, delta in (("", event.app_delta), (user_id, event.user_delta)):
                if delta is not None:
                    scoped = (event.app_name, who)
                    self._scoped[scoped] = self._merged(self._scoped.get(scoped), delta, now)
            state = self._states.get(key)
            return d.AppendedEvent(item, revision, state.version if state else 0)
