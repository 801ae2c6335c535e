"""The state service's domain: records, errors and input rules.

Nothing here knows about gRPC or SQL. The servicer turns protobuf into these
types (using the validators below) and the stores persist them.
"""

from __future__ import annotations

import base64
import enum
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from itertools import accumulate
from typing import Any, Generic, TypeVar

DEFAULT_STATE_KEY = "agent_state"
DEFAULT_TITLE = "New conversation"
MAX_TITLE_CHARS = 200
MAX_USER_ID_CHARS = 128
MAX_BATCH_DELETE = 1000
MAX_ID = 2**63 - 1
MIN_LEASE_TTL_MS = 100
MAX_LEASE_TTL_MS = 3_600_000
MAX_HOLDER_CHARS = 200
MAX_EXTERNAL_KEY_CHARS = 256

_STATE_KEY_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_DECIMAL_ID_RE = re.compile(r"[1-9][0-9]{0,18}")
# A JSON text whose value is an object starts with "{" after optional whitespace.
_JSON_OBJECT_START = re.compile(rb"[ \t\r\n]*\{")
_JSON_ARRAY_START = re.compile(rb"[ \t\r\n]*\[")


# ---------------------------------------------------------------- errors


class StateServiceError(Exception):
    """Base class: every error a caller can act on."""


class InvalidArgument(StateServiceError):
    pass


class NotFound(StateServiceError):
    """`missing` says what is absent: "conversation", "state", "message" or "task"."""

    def __init__(self, message: str, missing: str = "conversation") -> None:
        super().__init__(message)
        self.missing = missing


class VersionConflict(StateServiceError):
    """Compare-and-set failed; `current_version` is 0 when no state exists."""

    def __init__(self, expected: int, current_version: int) -> None:
        self.expected = expected
        self.current_version = current_version
        current = (
            "no state exists" if current_version == 0 else f"current version is {current_version}"
        )
        super().__init__(f"version conflict: expected version {expected}, {current}")


class ResourceExhausted(StateServiceError):
    """A size or count limit was reached."""


class PayloadTooLarge(ResourceExhausted):
    pass


class FailedPrecondition(StateServiceError):
    pass


class AlreadyExists(StateServiceError):
    """A conversation of this user already has the requested external key."""


class StoreError(StateServiceError):
    """The database failed the operation for a reason the caller cannot fix."""


class StoreUnavailable(StateServiceError):
    """The database could not be reached; the call may be retried."""


class LeaseHeld(FailedPrecondition):
    """Another turn holds the conversation's unexpired run lease. Which replica holds
    it is for operators (ErrorInfo metadata `holder`), not for the message."""

    def __init__(self, message: str, holder: str = "") -> None:
        super().__init__(message)
        self.holder = holder


class LeaseLost(FailedPrecondition):
    """The caller's lease was released or taken over by another turn."""


class CardPending(FailedPrecondition):
    """A record of the conversation awaits confirmation; `message_id` names it."""

    def __init__(self, message_id: int) -> None:
        super().__init__(
            f"confirmation card {message_id} is still pending: answer it before "
            "starting another turn"
        )
        self.message_id = message_id


# ------------------------------------------------------- messages to callers
# One place for the words of errors both stores raise.


def conversation_not_found(conversation_id: int, *, nothing_deleted: bool = False) -> NotFound:
    tail = "; nothing was deleted" if nothing_deleted else ""
    return NotFound(f"conversation {conversation_id} not found{tail}")


def message_not_found(message_id: int, conversation_id: int, where: str = "") -> NotFound:
    prefix = f"{where}: " if where else ""
    return NotFound(
        f"{prefix}message {message_id} not found in conversation {conversation_id}", "message"
    )


def status_mismatch(where: str, message_id: int, status: str, expected: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"{where}: message {message_id} has status {status}, expected {expected}"
    )


def not_awaiting(message_id: int, status: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"confirmation card {message_id} was already handled "
        f"(its record's status is {status}, not AWAITING_CONFIRM)"
    )


def user_lease_limit(running: int, limit: int) -> ResourceExhausted:
    return ResourceExhausted(
        f"user already has {running} running turns (limit {limit}); retry when one finishes"
    )


def delta_out_of_range(field: str, value: int, length: int) -> InvalidArgument:
    return InvalidArgument(
        f"delta.{field} is {value} but the stored context has {length} messages"
        f"{' after drop_head' if field == 'replace_from' else ''}; nothing was stored"
    )


def context_not_array() -> FailedPrecondition:
    return FailedPrecondition(
        'the stored state\'s "context" is not an array, so a delta cannot apply to it: '
        "send the whole state"
    )


def fields_name_context() -> InvalidArgument:
    return InvalidArgument(
        'delta.fields_json must not name "context" (messages travel in delta.messages)'
    )


def state_too_large(size: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the state after this delta would be {size} bytes, over the limit of {limit} bytes; "
        "nothing was stored"
    )


def lease_taken_over(task_id: int, holder_task_id: int) -> LeaseLost:
    return LeaseLost(
        f"the run lease of task {task_id} lapsed and task {holder_task_id} took it over; "
        "this turn's save was refused"
    )


# ---------------------------------------------------------------- records


class MessageRole(enum.StrEnum):
    USER = "USER"
    ASSISTANT = "ASSISTANT"


class MessageStatus(enum.StrEnum):
    NORMAL = "NORMAL"
    AWAITING_CONFIRM = "AWAITING_CONFIRM"
    INTERRUPTED = "INTERRUPTED"
    ERROR = "ERROR"
    STREAMING = "STREAMING"


@dataclass(frozen=True)
class Conversation:
    conversation_id: int
    user_id: str
    title: str
    create_time: datetime
    update_time: datetime
    external_key: str = ""  # caller-chosen, unique per user; "" = none


@dataclass(frozen=True)
class ResolvedConversation:
    conversation: Conversation
    created: bool


@dataclass(frozen=True)
class MessageRecord:
    message_id: int
    conversation_id: int
    user_id: str
    role: MessageRole
    blocks_json: bytes
    status: MessageStatus
    metadata_json: bytes
    create_time: datetime
    update_time: datetime


@dataclass(frozen=True)
class NewMessage:
    role: MessageRole
    blocks_json: bytes = b"[]"
    status: MessageStatus = MessageStatus.NORMAL
    metadata_json: bytes = b"{}"


@dataclass(frozen=True)
class MessageUpdate:
    message_id: int
    status: MessageStatus | None = None
    blocks_json: bytes | None = None
    metadata_json: bytes | None = None
    expected_status: MessageStatus | None = None


MessageWrite = NewMessage | MessageUpdate


@dataclass(frozen=True)
class Lease:
    task_id: int
    conversation_id: int
    user_id: str
    holder: str
    expire_time: datetime
    stop_requested: bool
    acquire_time: datetime | None = None  # filled by get_lease (the row's create_time)


@dataclass(frozen=True)
class AcquiredLease:
    lease: Lease
    lapsed_task_id: int | None = None  # the unreleased lease this one replaced


@dataclass(frozen=True)
class Compaction:
    """An audit record of one context compaction (ids and time set by the store)."""

    messages_before: int
    messages_after: int
    tokens_before: int
    tokens_after: int
    summary_chars: int
    reason: str
    compaction_id: int = 0
    create_time: datetime | None = None


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


@dataclass(frozen=True)
class DeleteCounts:
    conversations: int
    messages: int
    states: int

    def __add__(self, other: DeleteCounts) -> DeleteCounts:
        return DeleteCounts(
            self.conversations + other.conversations,
            self.messages + other.messages,
            self.states + other.states,
        )


T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    next_page_token: str


# ---------------------------------------------------------------- input rules


def validate_user_id(user_id: str) -> str:
    if not user_id:
        raise InvalidArgument("user_id is required")
    if len(user_id) > MAX_USER_ID_CHARS:
        raise InvalidArgument(f"user_id is longer than {MAX_USER_ID_CHARS} characters")
    if not user_id.isprintable():
        raise InvalidArgument("user_id must contain only printable characters")
    return user_id


def parse_id(value: str, what: str) -> int:
    """Parse a server-generated id written as a positive decimal 64-bit integer."""
    if not value:
        raise InvalidArgument(f"{what} is required")
    if not _DECIMAL_ID_RE.fullmatch(value) or int(value) > MAX_ID:
        raise InvalidArgument(f"{what} {value[:40]!r} is not a positive 64-bit decimal id")
    return int(value)


def validate_state_key(state_key: str) -> str:
    if not state_key:
        return DEFAULT_STATE_KEY
    if not _STATE_KEY_RE.fullmatch(state_key):
        raise InvalidArgument("state_key must be 1..64 characters of [A-Za-z0-9_.:-]")
    return state_key


def normalize_title(title: str, *, default: str | None = None) -> str:
    check_no_nul(title, "title")
    cleaned = " ".join(title.split())
    if not cleaned:
        if default is None:
            raise InvalidArgument("title must not be empty")
        return default
    if len(cleaned) > MAX_TITLE_CHARS:
        raise InvalidArgument(f"title is longer than {MAX_TITLE_CHARS} characters")
    return cleaned


def validate_external_key(key: str, what: str = "external_key") -> str:
    if not key:
        raise InvalidArgument(f"{what} must not be empty")
    if len(key) > MAX_EXTERNAL_KEY_CHARS:
        raise InvalidArgument(f"{what} is over {MAX_EXTERNAL_KEY_CHARS} characters")
    return check_no_nul(key, what)


def external_key_taken(key: str) -> AlreadyExists:
    return AlreadyExists(f"another conversation of this user already has external_key {key!r}")


def external_key_not_found(key: str) -> NotFound:
    return NotFound(f"no conversation of this user has external_key {key!r}")


def check_no_nul(text: str, what: str) -> str:
    """PostgreSQL text cannot hold U+0000: refuse it rather than fail in the database."""
    if "\x00" in text:
        raise InvalidArgument(f"{what} must not contain NUL (U+0000) characters")
    return text


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
    if not _JSON_OBJECT_START.match(payload):
        raise InvalidArgument("payload must be a JSON object (it must start with '{')")
    _check_json_bytes(payload, "payload")


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
        _check_json_bytes(message, what)
        check_json_depth(message, what, MAX_JSON_DEPTH - MAX_MESSAGE_DEPTH_IN_STATE)
    if delta.fields_json is not None:
        if not _JSON_OBJECT_START.match(delta.fields_json):
            raise InvalidArgument("delta.fields_json must be a JSON object")
        _check_json_bytes(delta.fields_json, "delta.fields_json")
        check_json_depth(delta.fields_json, "delta.fields_json")


def check_blocks_json(blocks: bytes, what: str = "blocks_json") -> bytes:
    if not blocks:
        return b"[]"
    if not _JSON_ARRAY_START.match(blocks):
        raise InvalidArgument(f"{what} must be a JSON array")
    _check_json_bytes(blocks, what)
    check_json_depth(blocks, what)
    return blocks


def check_metadata_json(metadata: bytes, what: str = "metadata_json") -> bytes:
    if not metadata:
        return b"{}"
    if not _JSON_OBJECT_START.match(metadata):
        raise InvalidArgument(f"{what} must be a JSON object")
    _check_json_bytes(metadata, what)
    check_json_depth(metadata, what)
    return metadata


def _check_json_bytes(data: bytes, what: str) -> None:
    # A raw NUL byte is never part of JSON text, and PostgreSQL's text protocol would
    # silently cut the value at it: refuse it instead of storing a truncated value.
    if b"\x00" in data:
        raise InvalidArgument(
            f"{what} contains a NUL byte (0x00), which JSON text cannot hold; nothing was stored"
        )


# Deeper JSON is refused (INVALID_ARGUMENT): a value may sit inside at most this many
# nested arrays and objects. Deep enough for any real state, and far below where
# PostgreSQL's parser runs out of stack (about 13,000 levels).
MAX_JSON_DEPTH = 512
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_DEPTH_STEP = [0] * 256
for _opening in b"[{":
    _DEPTH_STEP[_opening] = 1
for _closing in b"]}":
    _DEPTH_STEP[_closing] = -1


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text (brackets inside strings
    do not count). Linear in the size, without decoding: strings are cut out with byte
    operations that run in C."""
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside_strings = b"".join(unescaped.split(b'"')[0::2])
    brackets = outside_strings.translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def may_exceed_depth(data: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """False when the text cannot nest deeper than `limit` (it has too few brackets)."""
    return data.count(b"[") + data.count(b"{") > limit


def check_json_depth(data: bytes, what: str, limit: int = MAX_JSON_DEPTH) -> None:
    if may_exceed_depth(data, limit) and json_depth(data) > limit:
        raise too_deep(what, limit)


def too_deep(what: str, limit: int = MAX_JSON_DEPTH) -> InvalidArgument:
    within = " (counted from the top of the state)" if limit < MAX_JSON_DEPTH else ""
    return InvalidArgument(
        f"{what} nests arrays and objects more than {limit} levels deep{within}; nothing was stored"
    )


def page_size(requested: int, *, default: int, maximum: int) -> int:
    if requested < 0:
        raise InvalidArgument("page_size must not be negative")
    if requested == 0:
        return default
    return min(requested, maximum)


def parse_page_token(token: str) -> int | None:
    if not token:
        return None
    try:
        return parse_id(token, "page_token")
    except InvalidArgument:
        raise InvalidArgument("page_token is malformed: pass back a next_page_token") from None


def validate_ttl_ms(ttl_ms: int) -> int:
    if not MIN_LEASE_TTL_MS <= ttl_ms <= MAX_LEASE_TTL_MS:
        raise InvalidArgument(
            f"ttl_ms must be between {MIN_LEASE_TTL_MS} and {MAX_LEASE_TTL_MS}, got {ttl_ms}"
        )
    return ttl_ms


def validate_holder(holder: str) -> str:
    if not holder or len(holder) > MAX_HOLDER_CHARS or not holder.isprintable():
        raise InvalidArgument(f"holder must be 1..{MAX_HOLDER_CHARS} printable characters")
    return holder


def lease_conflict_message(lease: Lease) -> str:
    return (
        f"conversation {lease.conversation_id} has a running turn "
        f"(task {lease.task_id}, until {lease.expire_time.isoformat()}); retry when it ends"
    )


def lease_held(lease: Lease) -> LeaseHeld:
    return LeaseHeld(lease_conflict_message(lease), lease.holder)


# ------------------------------------------------------------- JSONB's rules


def jsonb_problem(data: bytes, expected: type) -> str | None:
    """Why PostgreSQL would refuse this as a jsonb object (dict), array (list) or any
    value (object), if it would. Only for small JSON (records), the in-memory store
    and error paths: it decodes in Python."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return str(exc)
    if not isinstance(value, expected):
        return "it must be a JSON " + ("object" if expected is dict else "array")
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "unsupported Unicode escape sequence: \\u0000 cannot be converted to text"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "invalid Unicode surrogate escape"
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def check_jsonb(data: bytes, expected: type, what: str) -> None:
    problem = jsonb_problem(data, expected)
    if problem is not None:
        if problem.startswith("it must be"):
            kind = "object" if expected is dict else "array"
            raise InvalidArgument(f"{what} must be a JSON {kind}")
        raise InvalidArgument(f"{what} is not JSON that PostgreSQL can store: {problem}")


# ---------------------------------------------------- jsonb's text, in Python


def parse_json(data: bytes) -> Any:
    """JSON text as Python values, numbers as Decimal (exactly as written)."""
    return json.loads(data, parse_float=Decimal, parse_int=Decimal)


def jsonb_text(value: Any) -> bytes:
    """The text PostgreSQL prints for `value` stored as jsonb: object keys shortest
    first then bytewise (the last of duplicate keys kept, as json.loads does), ", "
    and ": " separators, numbers as numeric prints them. The in-memory store returns
    states in this form, so both stores answer GetState with the same bytes."""
    parts: list[str] = []
    _jsonb_text(value, parts)
    return "".join(parts).encode()


def _jsonb_key(key: str) -> tuple[int, bytes]:
    raw = key.encode()
    return (len(raw), raw)


def _jsonb_text(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        # json.dumps escapes exactly what PostgreSQL's escape_json does.
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, Decimal | int):
        number = Decimal(value)
        out.append(format(abs(number) if number.is_zero() else number, "f"))
    elif isinstance(value, float):
        _jsonb_text(Decimal(repr(value)), out)
    elif isinstance(value, list):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(", ")
            _jsonb_text(item, out)
        out.append("]")
    elif isinstance(value, dict):
        out.append("{")
        for index, key in enumerate(sorted(value, key=_jsonb_key)):
            if index:
                out.append(", ")
            out.append(json.dumps(key, ensure_ascii=False))
            out.append(": ")
            _jsonb_text(value[key], out)
        out.append("}")
    else:
        raise TypeError(f"not a JSON value: {type(value).__name__}")


# ------------------------------------------------------- checkpoints (issue 15)
# A graph runtime's history of a conversation (LangGraph's checkpoints): the
# service stores the runtime's bytes and reads only ids, metadata and versions.

MAX_CHECKPOINT_ID_CHARS = 256
MAX_NAMESPACE_CHARS = 1024
MAX_SERIALIZER_TAG_CHARS = 64
MAX_TASK_PATH_CHARS = 1024
MAX_CHECKPOINT_WRITES = 1000
MAX_RUN_IDS = 1000
MAX_PRUNE_CONVERSATIONS = 1000


class CheckpointConflict(StateServiceError):
    """A checkpoint put's compare-and-set on its namespace's head failed;
    `current` is the head now ("" when the namespace holds none)."""

    def __init__(self, namespace: str, expected: str, current: str) -> None:
        self.namespace = namespace
        self.expected = expected
        self.current = current
        want = f"checkpoint {expected}" if expected else "no checkpoint"
        now = f"checkpoint {current}" if current else "no checkpoint"
        super().__init__(
            f"checkpoint conflict in namespace {namespace!r}: expected the head to be "
            f"{want}, it is {now} (another writer extended this history); nothing was stored"
        )


def target_has_checkpoints(conversation_id: int) -> FailedPrecondition:
    return FailedPrecondition(
        f"conversation {conversation_id} already has checkpoints: "
        "a copy never merges two histories; nothing was copied"
    )


class PruneStrategy(enum.StrEnum):
    KEEP_LATEST = "KEEP_LATEST"
    DELETE_ALL = "DELETE_ALL"


@dataclass(frozen=True)
class ChannelValue:
    channel: str
    version: str
    value_type: str
    value: bytes


@dataclass(frozen=True)
class CheckpointWrite:
    task_id: str
    idx: int
    channel: str
    value_type: str
    value: bytes
    task_path: str = ""


@dataclass(frozen=True)
class NewCheckpoint:
    namespace: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    checkpoint_type: str
    checkpoint: bytes
    metadata_json: bytes
    channel_versions: dict[str, str]
    new_values: tuple[ChannelValue, ...] = ()

    def run_id(self) -> str | None:
        """The metadata's `run_id` when it is a string (what DeleteCheckpointsForRuns matches)."""
        value = json.loads(self.metadata_json).get("run_id")
        return value if isinstance(value, str) else None


@dataclass(frozen=True)
class StoredCheckpoint:
    conversation_id: int
    namespace: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    checkpoint_type: str
    checkpoint: bytes
    metadata_json: bytes
    channel_versions: dict[str, str]
    channel_values: list[ChannelValue]
    pending_writes: list[CheckpointWrite]
    create_time: datetime


def check_text(value: str, what: str, max_chars: int, *, required: bool = False) -> str:
    """An id-like text field: bounded, no NUL (PostgreSQL text cannot hold it)."""
    if required and not value:
        raise InvalidArgument(f"{what} is required")
    if len(value) > max_chars:
        raise InvalidArgument(f"{what} is longer than {max_chars} characters")
    return check_no_nul(value, what)


def checkpoint_page_token(checkpoint_id: str, namespace: str) -> str:
    """The cursor after a page of checkpoints (newest first by id, then namespace)."""
    raw = json.dumps([checkpoint_id, namespace]).encode()
    return base64.urlsafe_b64encode(raw).decode()


def parse_checkpoint_page_token(token: str) -> tuple[str, str] | None:
    if not token:
        return None
    try:
        value = json.loads(base64.urlsafe_b64decode(token.encode()))
        if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
            return value[0], value[1]
    except ValueError:
        pass
    raise InvalidArgument("page_token is malformed: pass back a next_page_token")


def json_contains(stored: object, wanted: object) -> bool:
    """PostgreSQL's jsonb @> for decoded JSON: objects by key, arrays by element."""
    if isinstance(wanted, dict):
        return isinstance(stored, dict) and all(
            k in stored and json_contains(stored[k], v) for k, v in wanted.items()
        )
    if isinstance(wanted, list):
        return isinstance(stored, list) and all(
            any(json_contains(s, w) for s in stored) for w in wanted
        )
    if isinstance(wanted, bool) or isinstance(stored, bool):
        return type(wanted) is type(stored) and wanted == stored
    return stored == wanted


# ------------------------------------------- conversation items, scoped state
# Agent frameworks' sessions (issue 15): an ordered item list per conversation and
# app-/user-scoped state. See AppendItems ... AppendEvent in the contract.

MAX_ITEMS_PER_APPEND = 1000
MAX_APP_NAME_CHARS = 128
TEMP_KEY_PREFIX = "temp:"  # keys of a delta that are never stored (ADK's temp: scope)


class RevisionConflict(VersionConflict):
    """Compare-and-set on a conversation's item revision failed."""

    def __init__(self, expected: int, current_revision: int) -> None:
        super().__init__(expected, current_revision)
        self.args = (
            f"revision conflict: expected item revision {expected}, "
            f"current revision is {current_revision}",
        )


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
class ItemsPage:
    items: list[ConversationItem]
    next_page_token: str
    revision: int
    update_time: datetime


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
class ScopedStates:
    app: StoredState | None
    user: StoredState | None


@dataclass(frozen=True)
class EventAppend:
    """What AppendEvent writes besides the user and the conversation (deltas already
    stripped of temp: keys, each a JSON object or None)."""

    item: NewItem | None
    expected_revision: int | None
    state_key: str = DEFAULT_STATE_KEY
    state_delta: bytes | None = None
    app_name: str = ""
    app_delta: bytes | None = None
    user_delta: bytes | None = None


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
    """An item: a JSON object within the payload limit that JSONB can hold."""
    if len(item) > max_bytes:
        raise PayloadTooLarge(f"{what} is {len(item)} bytes, over the limit of {max_bytes} bytes")
    if not _JSON_OBJECT_START.match(item):
        raise InvalidArgument(f"{what} must be a JSON object")
    _check_json_bytes(item, what)
    check_json_depth(item, what)
    check_jsonb(item, dict, what)
    return item


def state_delta(delta: bytes, max_bytes: int, what: str) -> bytes | None:
    """A state delta checked as an item is; None when empty."""
    if not delta:
        return None
    check_item_json(delta, max_bytes, what)
    return None if json.loads(delta) == {} else delta


def without_temp_keys(delta: bytes, max_bytes: int, what: str) -> bytes | None:
    """A state delta checked as an item is, with its temp: keys dropped; None when empty."""
    if not delta:
        return None
    check_item_json(delta, max_bytes, what)
    value = json.loads(delta)
    kept = {k: v for k, v in value.items() if not k.startswith(TEMP_KEY_PREFIX)}
    if not kept:
        return None
    if len(kept) == len(value):
        return delta
    return json.dumps(kept, ensure_ascii=False).encode()
