"""The state service's concepts as plain Python types: what callers send and get back.

No protobuf here; agentstate.client.convert translates. State payloads are UTF-8 JSON
bytes (the service never interprets them beyond "a JSON object").
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

JSON = dict[str, Any]


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
class NewMessage:
    """A message record to append."""

    role: MessageRole
    blocks: list[JSON] = field(default_factory=list)
    status: MessageStatus = MessageStatus.NORMAL
    metadata: JSON = field(default_factory=dict)


@dataclass(frozen=True)
class MessageUpdate:
    """A change to a record; None leaves a field as it is. With `expected_status` it
    applies only if the record still has that status (else MessageStatusMismatch)."""

    message_id: str
    status: MessageStatus | None = None
    blocks: list[JSON] | None = None
    metadata: JSON | None = None
    expected_status: MessageStatus | None = None


MessageWrite = NewMessage | MessageUpdate


@dataclass(frozen=True)
class CompactionNote:
    """The audit record of one context compaction, saved with the state."""

    messages_before: int
    messages_after: int
    tokens_before: int
    tokens_after: int
    summary_chars: int
    reason: str


@dataclass(frozen=True)
class Compaction:
    """A stored compaction note (ListCompactions)."""

    compaction_id: str
    note: CompactionNote
    create_time: datetime | None


@dataclass(frozen=True)
class StateChange:
    """What changed in a state since `base_version` (the contract's StateDelta), for a
    delta save: drop `drop_head` messages from the front of "context", keep the first
    `replace_from` (None: all), append `messages` (each UTF-8 JSON), and when set replace
    every other member by `fields_json`'s. Sent instead of a whole payload."""

    base_version: int
    drop_head: int = 0
    replace_from: int | None = None
    messages: tuple[bytes, ...] = ()
    fields_json: bytes | None = None

    @property
    def size(self) -> int:
        return sum(map(len, self.messages)) + len(self.fields_json or b"")


@dataclass(frozen=True)
class NoOpenCard:
    """Start only if no record of the conversation awaits confirmation."""


@dataclass(frozen=True)
class OpenCard:
    """Start only if this record awaits confirmation (answering it)."""

    message_id: str


CardGuard = NoOpenCard | OpenCard


@dataclass(frozen=True)
class TurnRequest:
    """What starting a turn takes. conversation_id "" creates a conversation."""

    user_id: str
    conversation_id: str
    holder: str
    ttl_ms: int
    max_user_leases: int = 0
    title: str = ""
    new_records: tuple[NewMessage, ...] = ()
    guard: CardGuard | None = None
    state_key: str = ""
    # The version the caller holds already (it saved it itself): when it is the stored
    # one, BeginTurn sends no payload (BegunTurn.payload_omitted).
    cached_version: int | None = None


@dataclass(frozen=True)
class StateSnapshot:
    """A stored state: the whole payload (UTF-8 JSON object) and its version (>= 1)."""

    payload: bytes
    version: int
    update_time: datetime


@dataclass(frozen=True)
class LeaseInfo:
    task_id: str
    conversation_id: str
    stop_requested: bool
    expire_time: datetime
    holder: str = ""
    acquire_time: datetime | None = None  # set by get_lease; other calls may leave it None


@dataclass(frozen=True)
class AcquiredLease:
    lease: LeaseInfo
    lapsed_task_id: str  # "" unless this lease replaced one that lapsed unreleased


@dataclass(frozen=True)
class Conversation:
    conversation_id: str
    title: str
    create_time: datetime
    update_time: datetime
    user_id: str = ""
    external_key: str = ""  # "" = none (see resolve_conversation)
    labels: Mapping[str, str] = field(default_factory=dict)
    status: str = "IDLE"  # IDLE, RUNNING, AWAITING_CONFIRMATION or FAILED
    last_turn_time: datetime | None = None
    ttl_seconds: int = 0  # 0: no time to live
    ttl_renewed_by_writes: bool = False
    expire_time: datetime | None = None


@dataclass(frozen=True)
class ConversationSearch:
    """A page of ListConversations with filters: the conversations, the next page's
    token ("" on the last), the number of matches (with include_total, else 0; counted up
    to 10,000, and 10,001 means more) and, with include_state_key, each listed
    conversation's state under that key."""

    items: list[Conversation]
    next_page_token: str
    total_count: int = 0
    states: Mapping[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class ErasureReceipt:
    """That an erasure happened: no user content, no user id."""

    erasure_id: str
    done: bool
    counts: Mapping[str, int]
    start_time: datetime
    end_time: datetime | None


@dataclass(frozen=True)
class ResolvedConversation:
    conversation: Conversation
    created: bool  # True when this call created it


@dataclass(frozen=True)
class MessageRecord:
    message_id: str
    conversation_id: str
    role: MessageRole
    blocks_json: bytes
    status: MessageStatus
    metadata_json: bytes
    create_time: datetime
    update_time: datetime


@dataclass(frozen=True)
class BegunTurn:
    conversation: Conversation
    conversation_created: bool
    lease: LeaseInfo
    lapsed_task_id: str  # "" unless this lease replaced one that lapsed unreleased
    interrupted_records: int  # records of a dead turn now marked INTERRUPTED
    state: StateSnapshot | None  # None: no state saved yet
    records: list[MessageRecord]  # the appended `new_records`, in order
    # The stored version is TurnRequest.cached_version: `state` has its version and an
    # empty payload; the caller's own copy is current.
    payload_omitted: bool = False

    @property
    def conversation_id(self) -> str:
        return self.conversation.conversation_id

    @property
    def task_id(self) -> str:
        return self.lease.task_id

    @property
    def version(self) -> int:
        """The version to pass as EndTurn's expected_version (0: no state yet)."""
        return self.state.version if self.state is not None else 0


@dataclass(frozen=True)
class SavedState:
    """The outcome of UpsertState / EndTurn."""

    version: int
    update_time: datetime
    records: list[MessageRecord]  # written by `writes`, in order
    lease_released: bool = False  # EndTurn only


T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    next_page_token: str  # "" on the last page


@dataclass(frozen=True)
class Deleted:
    conversations: int
    messages: int
    states: int


# ------------------------------------------------------ checkpoints (issue 15)
# A graph runtime's checkpoint history of a conversation (LangGraph's checkpoints): the
# service stores the runtime's bytes; it reads only ids, metadata and channel versions.


class PruneStrategy(enum.StrEnum):
    KEEP_LATEST = "KEEP_LATEST"  # each namespace's newest checkpoint stays
    DELETE_ALL = "DELETE_ALL"


@dataclass(frozen=True)
class ChannelValue:
    """One channel's serialized value at one version."""

    channel: str
    version: str
    value_type: str  # the runtime's serializer tag, e.g. "msgpack"
    value: bytes


@dataclass(frozen=True)
class CheckpointWrite:
    """A pending write of a task: idx < 0 marks a special channel (replaced on rewrite)."""

    task_id: str
    idx: int
    channel: str
    value_type: str
    value: bytes
    task_path: str = ""


@dataclass(frozen=True)
class NewCheckpoint:
    """What put_checkpoint stores: the checkpoint without its channel values, its
    metadata (a UTF-8 JSON object), every channel's version and the values it introduces."""

    checkpoint_id: str
    checkpoint: bytes
    namespace: str = ""
    parent_checkpoint_id: str = ""
    checkpoint_type: str = ""
    metadata_json: bytes = b"{}"
    channel_versions: dict[str, str] = field(default_factory=dict)
    new_values: tuple[ChannelValue, ...] = ()


@dataclass(frozen=True)
class CheckpointRunLease:
    """What put_checkpoint_step does with the conversation's run lease: take it (`holder`,
    no `task_id`), renew the one `task_id` holds (`ttl_ms`), release it once stored."""

    holder: str = ""
    task_id: str = ""
    ttl_ms: int = 0
    release: bool = False


@dataclass(frozen=True)
class CheckpointPut:
    """What put_checkpoint_step did: the create time, the run lease after it (None when
    none was taken or renewed, or it was released)."""

    create_time: datetime
    lease: LeaseInfo | None = None


@dataclass(frozen=True)
class StoredCheckpoint:
    conversation_id: str
    namespace: str
    checkpoint_id: str
    parent_checkpoint_id: str  # "" for a history's first checkpoint
    checkpoint_type: str
    checkpoint: bytes
    metadata_json: bytes
    channel_versions: dict[str, str]
    channel_values: list[ChannelValue]  # those of channel_versions that are stored
    pending_writes: list[CheckpointWrite]  # by task path, task id, idx
    create_time: datetime


# ------------------------------------------- conversation items, scoped state


@dataclass(frozen=True)
class NewItem:
    """An item to append: a JSON object (UTF-8 bytes, or a mapping that is serialised)
    and the caller's time for it (None: the time of the append)."""

    item: bytes | dict[str, Any]
    item_time: datetime | None = None


@dataclass(frozen=True)
class Item:
    """One item of a conversation's ordered item list."""

    conversation_id: str
    seq: int  # larger for a later append, never reused
    item_json: bytes
    item_time: datetime
    create_time: datetime


@dataclass(frozen=True)
class AppendedItems:
    items: list[Item]
    revision: int  # the conversation's item revision after the append


@dataclass(frozen=True)
class ItemsPage:
    items: list[Item]  # oldest first
    next_page_token: str  # "" on the last page
    revision: int  # the item revision when the page was read
    update_time: datetime  # when the conversation last changed
    # Only when asked for (include_state_key, include_scoped_app_name); None: none stored.
    state: StateSnapshot | None = None
    scoped: ScopedStates | None = None


@dataclass(frozen=True)
class PoppedItem:
    item: Item | None  # None: the list was empty
    revision: int


@dataclass(frozen=True)
class ClearedItems:
    deleted: int
    revision: int


@dataclass(frozen=True)
class ScopedStates:
    """An application's app-scoped state and one user's user-scoped state in it."""

    app: StateSnapshot | None  # None: never written
    user: StateSnapshot | None


@dataclass(frozen=True)
class AppendedEvent:
    item: Item | None  # None when no item was appended
    revision: int  # the item revision after the call
    state_version: int  # the conversation state's version under the state key (0: none)


# The names of 0.1.0, before the client took the contract's (NewMessage, MessageUpdate,
# MessageWrite, MessageRole, MessageStatus): deprecated, they go in the next release.
DEPRECATED_NAMES = {
    "NewRecord": "NewMessage",
    "RecordUpdate": "MessageUpdate",
    "RecordWrite": "MessageWrite",
    "RecordRole": "MessageRole",
    "RecordStatus": "MessageStatus",
}

if TYPE_CHECKING:
    NewRecord = NewMessage
    RecordUpdate = MessageUpdate
    RecordWrite = MessageWrite
    RecordRole = MessageRole
    RecordStatus = MessageStatus
else:

    def __getattr__(name: str) -> Any:
        if name in DEPRECATED_NAMES:
            new = DEPRECATED_NAMES[name]
            warnings.warn(
                f"agentstate.client.{name} is deprecated: use {new} (the contract's name)",
                DeprecationWarning,
                stacklevel=2,
            )
            return globals()[new]
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
