"""Agent states and turns: whole saves, deltas, the card guards of BeginTurn."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from agentstate.state_service.domain import jsontext
from agentstate.state_service.domain.conversations import DEFAULT_TITLE, Conversation
from agentstate.state_service.domain.errors import (
    InvalidArgument,
    PayloadTooLarge,
    context_not_array,
    delta_out_of_range,
    fields_name_context,
    state_too_large,
)
from agentstate.state_service.domain.leases import Lease
from agentstate.state_service.domain.messages import MessageRecord, NewMessage
from agentstate.state_service.domain.rules import (
    JSON_OBJECT_START,
    MAX_JSON_DEPTH,
    check_json_bytes,
    check_json_depth,
)

DEFAULT_STATE_KEY = "agent_state"


_STATE_KEY_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


@dataclass(frozen=True)
class StoredState:
    payload: bytes
    version: int
    update_time: datetime


@dataclass(frozen=True)
class StateDelta:
    """What changed in a state since `base_version` (the contract's StateDelta): drop
    `drop_head` messages from the front of "context", keep the first `replace_from`
    (None: all), append `messages`, and replace every other member by `fields_json`'s
    (None: keep them). Each part is UTF-8 JSON text."""

    base_version: int
    drop_head: int = 0
    replace_from: int | None = None
    messages: tuple[bytes, ...] = ()
    fields_json: bytes | None = None


@dataclass(frozen=True)
class RequireNoneAwaiting:
    """Card guard: no record of the conversation may await confirmation."""


@dataclass(frozen=True)
class RequireAwaiting:
    """Card guard: this record must await confirmation (a card is answered once)."""

    message_id: int


CardGuard = RequireNoneAwaiting | RequireAwaiting


@dataclass(frozen=True)
class TurnStart:
    """What BeginTurn needs besides the user and the conversation."""

    holder: str
    ttl_ms: int
    max_user_leases: int = 0
    title: str = DEFAULT_TITLE  # for a new conversation
    state_key: str = DEFAULT_STATE_KEY
    new_messages: tuple[NewMessage, ...] = ()
    guard: CardGuard | None = None
    # The version the caller already holds: when it is the stored one, the state's
    # payload is not returned (BegunTurn.payload_omitted).
    cached_version: int | None = None


@dataclass(frozen=True)
class BegunTurn:
    conversation: Conversation
    conversation_created: bool
    lease: Lease
    lapsed_task_id: int | None
    interrupted_records: int
    state: StoredState | None  # None: no state yet
    messages: list[MessageRecord]
    payload_omitted: bool = False  # state.payload is b"": the caller's cached copy is current


@dataclass(frozen=True)
class UpsertResult:
    version: int
    update_time: datetime
    messages: list[MessageRecord] = field(default_factory=list)
    lease_released: bool = False  # EndTurn only


def validate_state_key(state_key: str) -> str:
    if not state_key:
        return DEFAULT_STATE_KEY
    if not _STATE_KEY_RE.fullmatch(state_key):
        raise InvalidArgument("state_key must be 1..64 characters of [A-Za-z0-9_.:-]")
    return state_key


def check_state_payload(payload: bytes, max_bytes: int) -> None:
    """Cheap checks done before the database parses the JSON itself.

    The payload is not decoded here: PostgreSQL's JSONB input is the parser of
    record, so large states cross the service without a Python round trip. Its
    nesting depth is the store's to check (cheaply where it can: see MAX_JSON_DEPTH).
    """
    if len(payload) > max_bytes:
        raise PayloadTooLarge(
            f"payload is {len(payload)} bytes, over the limit of {max_bytes} bytes"
        )
    if not JSON_OBJECT_START.match(payload):
        raise InvalidArgument("payload must be a JSON object (it must start with '{')")
    check_json_bytes(payload, "payload")


# A context message sits inside the state object and its "context" array.
MAX_MESSAGE_DEPTH_IN_STATE = 2


def check_state_delta(delta: StateDelta) -> None:
    """Cheap checks of every part of a delta, before the database parses each one
    (which is the JSON check of record, as for a whole payload)."""
    if delta.base_version < 1:
        raise InvalidArgument("delta.base_version must be at least 1 (a first save is whole)")
    if delta.drop_head < 0:
        raise InvalidArgument("delta.drop_head must not be negative")
    if delta.replace_from is not None and delta.replace_from < 0:
        raise InvalidArgument("delta.replace_from must not be negative")
    for index, message in enumerate(delta.messages):
        what = f"delta.messages[{index}]"
        if not message.strip():
            raise InvalidArgument(f"{what} is empty: a message is a JSON value")
        check_json_bytes(message, what)
        check_json_depth(message, what, MAX_JSON_DEPTH - MAX_MESSAGE_DEPTH_IN_STATE)
    if delta.fields_json is not None:
        if not JSON_OBJECT_START.match(delta.fields_json):
            raise InvalidArgument("delta.fields_json must be a JSON object")
        check_json_bytes(delta.fields_json, "delta.fields_json")
        check_json_depth(delta.fields_json, "delta.fields_json")


CONTEXT_KEY = '"context"'  # the key's spelling in a state's members (jsontext.key_text)


@dataclass(frozen=True)
class StateForm:
    """How a state is stored (both stores): a state whose "context" is an array is
    split, its messages' texts as sent between a head and a tail (the other members,
    in the order sent, "context" where it was); any other state is its members. The
    text a read returns is `text()`: every value as sent, the separators between the
    top-level members and between the messages ", " and ": " (as json.dumps and jsonb
    write them). Keys are the last of duplicates, where the first stood."""

    keys: tuple[str, ...] = ()
    values: tuple[str, ...] = ()
    head: str | None = None  # None: not split
    tail: str = ""
    messages: tuple[str, ...] = ()

    @property
    def split(self) -> bool:
        return self.head is not None

    def text(self) -> bytes:
        if self.head is None:
            return jsontext.object_text(list(zip(self.keys, self.values, strict=True))).encode()
        return (self.head + "[" + ", ".join(self.messages) + "]" + self.tail).encode()


def _unique_members(
    data: bytes, what: str, split: str | None = None
) -> list[tuple[str, str, tuple[str, ...] | None]]:
    """(key text, value text, the elements' texts when the key is `split` and the value
    an array), the last of duplicate keys where the first stood."""
    kept: dict[str, tuple[str, str, tuple[str, ...] | None]] = {}
    for member in jsontext.members(data, what, split):
        kept[member.key] = (jsontext.key_text(member.key), member.value, member.elements)
    return list(kept.values())


def frame(before: list[tuple[str, str]], after: list[tuple[str, str]]) -> tuple[str, str]:
    """The head and tail around a context array (as agentstate_state_frame writes them)."""
    head = "{" + "".join(f"{k}: {v}, " for k, v in before) + CONTEXT_KEY + ": "
    tail = "".join(f", {k}: {v}" for k, v in after) + "}"
    return head, tail


def state_form(payload: bytes, what: str = "payload", *, split: bool = True) -> StateForm:
    """A whole state's stored form (InvalidArgument unless it is a JSON object); with
    split=False always its members (a merged state's form)."""
    found = _unique_members(payload, what, "context" if split else None)
    for index, (key, _, elements) in enumerate(found):
        if elements is not None and key == CONTEXT_KEY:
            head, tail = frame(
                [(k, v) for k, v, _ in found[:index]], [(k, v) for k, v, _ in found[index + 1 :]]
            )
            return StateForm(head=head, tail=tail, messages=elements)
    return StateForm(tuple(k for k, _, _ in found), tuple(v for _, v, _ in found))


def fields_frame(fields_json: bytes) -> tuple[str, str]:
    """The head and tail a delta's fields_json makes: its members, then "context"."""
    found = _unique_members(fields_json, "delta.fields_json")
    if any(k == CONTEXT_KEY for k, _, _ in found):
        raise fields_name_context()
    return frame([(k, v) for k, v, _ in found], [])


def check_delta_parts(delta: StateDelta) -> tuple[tuple[str, ...], tuple[str, str] | None]:
    """The delta's messages checked (each one JSON value, kept as sent) and the frame
    its fields_json makes (None: keep the stored one)."""
    messages = []
    for index, message in enumerate(delta.messages):
        jsontext.check_json(message, object, f"delta.messages[{index}]")
        messages.append(message.decode().strip(" \t\r\n"))
    fields = None if delta.fields_json is None else fields_frame(delta.fields_json)
    return tuple(messages), fields


def apply_delta(
    stored: bytes, delta: StateDelta, max_state_bytes: int | None, *, split: bool
) -> bytes:
    """The stored state's text after `delta` (the in-memory store; PostgreSQL's
    agentstate_save_state does the same on the stored form). `split`: the state is
    stored split (else it is its members, and a "context" member is not an array to it)."""
    messages, fields = check_delta_parts(delta)  # checked before the version, too
    form = state_form(stored, "the stored state", split=split)
    if form.head is None:
        if CONTEXT_KEY in form.keys:
            raise context_not_array()
        head, tail = frame(list(zip(form.keys, form.values, strict=True)), [])
        form = StateForm(head=head, tail="}")
    assert form.head is not None
    context = list(form.messages)
    if delta.drop_head > len(context):
        raise delta_out_of_range("drop_head", delta.drop_head, len(context))
    context = context[delta.drop_head :]
    keep = len(context) if delta.replace_from is None else delta.replace_from
    if keep > len(context):
        raise delta_out_of_range("replace_from", keep, len(context))
    head, tail = fields if fields is not None else (form.head, form.tail)
    text = StateForm(head=head, tail=tail, messages=(*context[:keep], *messages)).text()
    if max_state_bytes is not None and len(text) > max_state_bytes:
        raise state_too_large(len(text), max_state_bytes)
    return text
