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
from agentstate.state_service.storage.postgres.encryption import UserKeys, ad
from agentstate.state_service.storage.postgres.states import state_ad


def _raw(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


async def _members(
    keys: UserKeys, delta: d.Delta | None, bound: bytes
) -> tuple[TextArray | None, TextArray | None]:
    """A merge's members: keys as they are (the database merges by them), values sealed
    when encryption is on."""
    if delta is None:
        return None, None
    values = await keys.seal_all(delta.values, bound) if keys.on else delta.values
    return TextArray(delta.keys), TextArray(values)


def item_ad(user_id: str, conversation_id: int) -> bytes:
    """An item is bound to its user and conversation (its seq is the database's)."""
    return ad(user_id, conversation_id, "item")


def scoped_ad(user_id: str, app_name: str) -> bytes:
    """A scoped state's values: to the app and the user ('' for app-scoped state)."""
    return ad(user_id, app_name, "scoped")


# App-scoped state belongs to no user: its values are sealed with the data key of the
# user id '' (which no erasure destroys).
APP_KEYS = ""


async def item_of(keys: UserKeys, conversation_id: int, row: Row) -> d.ConversationItem:
    return d.ConversationItem(
        conversation_id=conversation_id,
        seq=int(row["seq"]),
        item_json=await keys.open(_raw(row["item"]), item_ad(keys.user_id, conversation_id)),
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
        keys = self._keys(user_id)
        texts: Sequence[bytes | str] = [i.item_json for i in items]
        if keys.on and texts:
            texts = await keys.seal_all(texts, item_ad(user_id, conversation_id))
        rows = await self._rows(
            sql.APPEND_ITEMS,
            {
                "user_id": user_id,
                "conversation_id": conversation_id,
                "items": TextArray(texts),
                "item_times": [i.item_time for i in items],
                "expected_revision": expected_revision,
            },
        )
        return d.AppendedItems(
            [await item_of(keys, conversation_id, row) for row in rows],
            int(rows[-1]["revision"]),
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
        keys = self._keys(user_id)
        found = [await item_of(keys, conversation_id, r) for r in rows if r["seq"] is not None]
        items = found[:page_size]
        token = str(items[-1].seq) if len(found) > page_size else ""
        first = rows[0]
        states: dict[str, StoredState] = {}
        for r in rows if with_states else ():
            part = r["part"]
            if part in (None, "item"):
                continue
            # Opened as get_state and get_scoped_state open them (sealed values).
            if part == "state":
                opener, bound = keys, state_ad(user_id, conversation_id, state_key)
            else:
                owner = user_id if part == "user" else ""
                opener, bound = self._keys(owner or APP_KEYS), scoped_ad(owner, scoped_app)
            payload = await opener.open(_raw(r["payload"]), bound)
            states[part] = StoredState(payload, int(r["version"]), r["update_time"])
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
        keys = self._keys(user_id)
        item = await item_of(keys, conversation_id, row) if row["seq"] is not None else None
        return d.PoppedItem(item, int(row["revision"]))

    async def clear_items(self, *, user_id: str, conversation_id: int) -> d.ClearedItems:
        (row,) = await self._rows(
            sql.CLEAR_ITEMS, {"user_id": user_id, "conversation_id": conversation_id}
        )
        return d.ClearedItems(int(row["deleted"]), int(row["revision"]))

    async def get_scoped_state(self, *, user_id: str, app_name: str) -> d.ScopedStates:
        rows = await self._rows(sql.SELECT_SCOPED_STATE, {"user_id": user_id, "app_name": app_name})
        states = {}
        for row in rows:
            owner = row["user_id"]
            keys = self._keys(owner or APP_KEYS)
            payload = await keys.open(_raw(row["payload"]), scoped_ad(owner, app_name))
            states[owner] = StoredState(payload, int(row["version"]), row["update_time"])
        return d.ScopedStates(app=states.get(""), user=states.get(user_id))

    async def append_event(
        self, *, user_id: str, conversation_id: int, event: d.EventAppend
    ) -> d.AppendedEvent:
        keys = self._keys(user_id)
        state_keys, state_values = await _members(
            keys, event.state_delta, state_ad(user_id, conversation_id, event.state_key)
        )
        app_keys, app_values = await _members(
            self._keys(APP_KEYS), event.app_delta, scoped_ad("", event.app_name)
        )
        user_keys, user_values = await _members(
            keys, event.user_delta, scoped_ad(user_id, event.app_name)
        )
        item_text: str | None = event.item.item_json.decode() if event.item else None
        if item_text is not None and keys.on:
            item_text = await keys.seal(item_text, item_ad(user_id, conversation_id))
        (row,) = await self._rows(
            sql.APPEND_EVENT,
            {
                "user_id": user_id,
                "conversation_id": conversation_id,
                "item": item_text,
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
        item = await item_of(keys, conversation_id, row) if row["seq"] is not None else None
        return d.AppendedEvent(item, int(row["revision"]), int(row["state_version"]))
