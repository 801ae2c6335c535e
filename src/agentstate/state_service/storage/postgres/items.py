"""Conversation items (OpenAI Agents), events and app/user-scoped state (ADK): a capability."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from agentstate.state_service import domain as d
from agentstate.state_service.domain import (
    StoredState,
)
from agentstate.state_service.storage.base.items import ItemStore
from agentstate.state_service.storage.postgres import sql
from agentstate.state_service.storage.postgres.codecs import (
    Row,
    TextArray,
)
from agentstate.state_service.storage.postgres.connection import (
    PostgresConnection,
)


def _raw(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _members(delta: d.Delta | None) -> tuple[TextArray | None, TextArray | None]:
    if delta is None:
        return None, None
    return TextArray(delta.keys), TextArray(delta.values)


def item_of(conversation_id: int, row: Row) -> d.ConversationItem:
    return d.ConversationItem(
        conversation_id=conversation_id,
        seq=int(row["seq"]),
        item_json=_raw(row["item"]),
        item_time=row["item_time"],
        create_time=row["create_time"],
    )


class PostgresItems(PostgresConnection, ItemStore):
    async def append_items(
        self,
        *,
        user_id: str,
        conversation_id: int,
        items: Sequence[d.NewItem],
        expected_revision: int | None,
    ) -> d.AppendedItems:
        rows = await self._rows(
            sql.APPEND_ITEMS,
            {
                "user_id": user_id,
                "conversation_id": conversation_id,
                "items": TextArray([i.item_json for i in items]),
                "item_times": [i.item_time for i in items],
                "expected_revision": expected_revision,
            },
        )
        return d.AppendedItems(
            [item_of(conversation_id, row) for row in rows], int(rows[-1]["revision"])
        )

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
        params = {
            "user_id": user_id,
            "conversation_id": conversation_id,
            "last_n": last_n,
            "min_item_time": min_item_time,
            "after_seq": after_seq,
            "limit": page_size + 1,
        }
        with_states = bool(state_key or scoped_app)
        if with_states:
            params |= {"state_key": state_key, "scoped_app": scoped_app}
        rows = await self._rows(
            sql.LIST_ITEMS_WITH_STATES if with_states else sql.LIST_ITEMS, params
        )
        if not rows:
            raise d.conversation_not_found(conversation_id)
        found = [item_of(conversation_id, r) for r in rows if r["seq"] is not None]
        items = found[:page_size]
        token = str(items[-1].seq) if len(found) > page_size else ""
        first = rows[0]
        states = {
            r["part"]: StoredState(_raw(r["payload"]), int(r["version"]), r["update_time"])
            for r in rows
            if with_states and r["part"] not in (None, "item")
        }
        return d.ItemsPage(
            items,
            token,
            int(first["item_revision"]),
            first["conversation_update_time"],
            states.get("state"),
            d.ScopedStates(states.get("app"), states.get("user")) if scoped_app else None,
        )

    async def pop_item(
        self, *, user_id: str, conversation_id: int, expected_revision: int | None
    ) -> d.PoppedItem:
        (row,) = await self._rows(
            sql.POP_ITEM,
            {
                "user_id": user_id,
                "conversation_id": conversation_id,
                "expected_revision": expected_revision,
            },
        )
        item = item_of(conversation_id, row) if row["seq"] is not None else None
        return d.PoppedItem(item, int(row["revision"]))

    async def clear_items(self, *, user_id: str, conversation_id: int) -> d.ClearedItems:
        (row,) = await self._rows(
            sql.CLEAR_ITEMS, {"user_id": user_id, "conversation_id": conversation_id}
        )
        return d.ClearedItems(int(row["deleted"]), int(row["revision"]))

    async def get_scoped_state(self, *, user_id: str, app_name: str) -> d.ScopedStates:
        rows = await self._rows(sql.SELECT_SCOPED_STATE, {"user_id": user_id, "app_name": app_name})
        states = {
            row["user_id"]: StoredState(
                _raw(row["payload"]), int(row["version"]), row["update_time"]
            )
            for row in rows
        }
        return d.ScopedStates(app=states.get(""), user=states.get(user_id))

    async def append_event(
        self, *, user_id: str, conversation_id: int, event: d.EventAppend
    ) -> d.AppendedEvent:
        state_keys, state_values = _members(event.state_delta)
        app_keys, app_values = _members(event.app_delta)
        user_keys, user_values = _members(event.user_delta)
        (row,) = await self._rows(
            sql.APPEND_EVENT,
            {
                "user_id": user_id,
                "conversation_id": conversation_id,
                "item": event.item.item_json.decode() if event.item else None,
                "item_time": event.item.item_time if event.item else None,
                "expected_revision": event.expected_revision,
                "state_key": event.state_key,
                "state_keys": state_keys,
                "state_values": state_values,
                "app_name": event.app_name,
                "app_keys": app_keys,
                "app_values": app_values,
                "user_keys": user_keys,
                "user_values": user_values,
            },
        )
        item = item_of(conversation_id, row) if row["seq"] is not None else None
        return d.AppendedEvent(item, int(row["revision"]), int(row["state_version"]))
