"""Conversation items, events and app/user-scoped state (OpenAI Agents, ADK)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from agentstate.state_service.domain import jsontext
from agentstate.state_service.domain.errors import InvalidArgument, PayloadTooLarge
from agentstate.state_service.domain.rules import (
    JSON_OBJECT_START,
    check_json_bytes,
    check_json_depth,
)
from agentstate.state_service.domain.states import DEFAULT_STATE_KEY, StoredState

MAX_ITEMS_PER_APPEND = 1000


MAX_APP_NAME_CHARS = 128


TEMP_KEY_PREFIX = "temp:"  # keys of a delta that are never stored (ADK's temp: scope)


@dataclass(frozen=True)
class NewItem:
    item_json: bytes
    item_time: datetime | None = None  # None: the time of the append


@dataclass(frozen=True)
class ConversationItem:
    conversation_id: int
    seq: int
    item_json: bytes
    item_time: datetime
    create_time: datetime


@dataclass(frozen=True)
class ScopedStates:
    app: StoredState | None
    user: StoredState | None


@dataclass(frozen=True)
class ItemsPage:
    items: list[ConversationItem]
    next_page_token: str
    revision: int
    update_time: datetime
    # Read with the items when asked for (list_items' state_key, scoped_app); None: none.
    state: StoredState | None = None
    scoped: ScopedStates | None = None


@dataclass(frozen=True)
class AppendedItems:
    items: list[ConversationItem]
    revision: int


@dataclass(frozen=True)
class PoppedItem:
    item: ConversationItem | None  # None: the list was empty
    revision: int


@dataclass(frozen=True)
class ClearedItems:
    deleted: int
    revision: int


@dataclass(frozen=True)
class EventAppend:
    """What AppendEvent writes besides the user and the conversation (deltas already
    stripped of temp: keys, each a JSON object or None)."""

    item: NewItem | None
    expected_revision: int | None
    state_key: str = DEFAULT_STATE_KEY
    state_delta: Delta | None = None
    app_name: str = ""
    app_delta: Delta | None = None
    user_delta: Delta | None = None


@dataclass(frozen=True)
class AppendedEvent:
    item: ConversationItem | None
    revision: int
    state_version: int


def validate_app_name(app_name: str) -> str:
    if not app_name:
        raise InvalidArgument("app_name is required")
    if len(app_name) > MAX_APP_NAME_CHARS or not app_name.isprintable():
        raise InvalidArgument(f"app_name must be 1..{MAX_APP_NAME_CHARS} printable characters")
    return app_name


def check_item_json(item: bytes, max_bytes: int, what: str) -> bytes:
    """An item: a JSON object within the payload limit, kept as its text (jsontext)."""
    if len(item) > max_bytes:
        raise PayloadTooLarge(f"{what} is {len(item)} bytes, over the limit of {max_bytes} bytes")
    if not JSON_OBJECT_START.match(item):
        raise InvalidArgument(f"{what} must be a JSON object")
    check_json_bytes(item, what)
    check_json_depth(item, what)
    jsontext.check_json(item, dict, what)
    return item


@dataclass(frozen=True)
class Delta:
    """A state delta's members to set: key spellings and value texts as sent (the last
    of duplicate keys; jsontext.key_text spells the keys)."""

    keys: tuple[str, ...]
    values: tuple[str, ...]

    def text(self) -> bytes:
        return jsontext.object_text(list(zip(self.keys, self.values, strict=True))).encode()


def _delta(delta: bytes, max_bytes: int, what: str, *, drop_temp: bool) -> Delta | None:
    if not delta:
        return None
    if len(delta) > max_bytes:
        raise PayloadTooLarge(f"{what} is {len(delta)} bytes, over the limit of {max_bytes} bytes")
    check_json_bytes(delta, what)
    check_json_depth(delta, what)
    kept: dict[str, tuple[str, str]] = {}  # members() checks the JSON and that it is an object
    for member in jsontext.members(delta, what):
        if drop_temp and member.key.startswith(TEMP_KEY_PREFIX):
            continue
        kept[member.key] = (jsontext.key_text(member.key), member.value)
    if not kept:
        return None
    pairs = list(kept.values())
    return Delta(tuple(k for k, _ in pairs), tuple(v for _, v in pairs))


def state_delta(delta: bytes, max_bytes: int, what: str) -> Delta | None:
    """A state delta checked as an item is; None when empty."""
    return _delta(delta, max_bytes, what, drop_temp=False)


def without_temp_keys(delta: bytes, max_bytes: int, what: str) -> Delta | None:
    """A state delta checked as an item is, with its temp: keys dropped; None when empty."""
    return _delta(delta, max_bytes, what, drop_temp=True)
