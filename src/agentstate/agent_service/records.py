"""What the agent asks of the state service, in its own types (no protobuf).

Conversations and the message records a UI replays, the writes a turn makes to
them, and what starting and ending a turn take and give. StateClient translates
these to and from the StateService contract; nothing else in the agent knows it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from agentstate.agent_service.agent_state import AgentState

JSON = dict[str, Any]


class RecordRole(enum.StrEnum):
    USER = "USER"
    ASSISTANT = "ASSISTANT"


class RecordStatus(enum.StrEnum):
    NORMAL = "NORMAL"
    AWAITING_CONFIRM = "AWAITING_CONFIRM"
    INTERRUPTED = "INTERRUPTED"
    ERROR = "ERROR"
    STREAMING = "STREAMING"


@dataclass(frozen=True)
class NewRecord:
    """A message record to append."""

    role: RecordRole
    blocks: list[JSON] = field(default_factory=list)
    status: RecordStatus = RecordStatus.NORMAL
    metadata: JSON = field(default_factory=dict)


@dataclass(frozen=True)
class RecordUpdate:
    """A change to a record; None leaves a field as it is. With `expected_status`
    it applies only if the record still has that status (else errors.Conflict)."""

    message_id: str
    status: RecordStatus | None = None
    blocks: list[JSON] | None = None
    metadata: JSON | None = None
    expected_status: RecordStatus | None = None


RecordWrite = NewRecord | RecordUpdate


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
class StateChange:
    """What a turn changed in the state since the version it loaded (a delta save, the
    contract's StateDelta): drop `drop_head` messages from the front of the context,
    keep the first `replace_from` (None: all), append `messages`, and when set replace
    the other fields by `fields_json`. Each part is encoded JSON."""

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
    max_user_leases: int
    title: str = ""
    new_records: tuple[NewRecord, ...] = ()
    guard: CardGuard | None = None
    cached_version: int | None = None  # the version held already: its payload is not sent


@dataclass(frozen=True)
class BegunTurn:
    conversation_id: str
    conversation_created: bool
    task_id: str
    lapsed_task_id: str  # "" unless this lease replaced one that lapsed unreleased
    interrupted_records: int  # records of a dead turn now marked INTERRUPTED
    state: AgentState | None  # None: no state saved yet
    version: int  # 0 when there is no state
    record_ids: list[str]  # of `new_records`, in order
    payload_omitted: bool = False  # the stored version is TurnRequest.cached_version


@dataclass(frozen=True)
class EndedTurn:
    version: int
    lease_released: bool


@dataclass(frozen=True)
class LoadedState:
    state: AgentState | None  # None: the conversation has no state yet
    version: int  # 0 when there is no state


@dataclass(frozen=True)
class LeaseInfo:
    task_id: str
    conversation_id: str
    stop_requested: bool
    expire_time: datetime


@dataclass(frozen=True)
class Conversation:
    conversation_id: str
    title: str
    create_time: datetime
    update_time: datetime


@dataclass(frozen=True)
class MessageRecord:
    message_id: str
    conversation_id: str
    role: RecordRole
    blocks_json: bytes
    status: RecordStatus
    metadata_json: bytes
    create_time: datetime
    update_time: datetime


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
