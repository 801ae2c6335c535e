"""The public Python client of the state service.

    from agentstate.client import AsyncStateClient, StateClient, VersionConflict

    with StateClient.connect("127.0.0.1:50051") as state:
        conversation = state.resolve_conversation("alice", "thread-42").conversation
        saved = state.upsert_state("alice", conversation.conversation_id, {"n": 1},
                                   expected_version=0)

Types (agentstate.client.types) carry no protobuf; state payloads are UTF-8 JSON bytes
(a mapping is serialised on the way in). Failures raise agentstate.client.errors'
exceptions, all subclasses of StateError. This package imports neither service.
"""

from agentstate.client.aio import AsyncStateClient
from agentstate.client.errors import (
    AlreadyExists,
    CardAlreadyHandled,
    CardPending,
    DeadlineExceeded,
    FailedPrecondition,
    InternalError,
    InvalidArgument,
    LeaseHeld,
    LeaseLost,
    LimitReached,
    MessageStatusMismatch,
    NotFound,
    PayloadTooLarge,
    ResourceExhausted,
    StateError,
    Unavailable,
    VersionConflict,
)
from agentstate.client.settings import ClientSettings
from agentstate.client.sync import StateClient
from agentstate.client.types import (
    AcquiredLease,
    AppendedEvent,
    AppendedItems,
    BegunTurn,
    CardGuard,
    ClearedItems,
    Compaction,
    CompactionNote,
    Conversation,
    Deleted,
    Item,
    ItemsPage,
    LeaseInfo,
    MessageRecord,
    NewItem,
    NewRecord,
    NoOpenCard,
    OpenCard,
    Page,
    PoppedItem,
    RecordRole,
    RecordStatus,
    RecordUpdate,
    RecordWrite,
    ResolvedConversation,
    SavedState,
    ScopedStates,
    StateSnapshot,
    TurnRequest,
)

__all__ = [
    "AcquiredLease",
    "AlreadyExists",
    "AppendedEvent",
    "AppendedItems",
    "AsyncStateClient",
    "BegunTurn",
    "CardAlreadyHandled",
    "CardGuard",
    "CardPending",
    "ClearedItems",
    "ClientSettings",
    "Compaction",
    "CompactionNote",
    "Conversation",
    "DeadlineExceeded",
    "Deleted",
    "FailedPrecondition",
    "InternalError",
    "InvalidArgument",
    "Item",
    "ItemsPage",
    "LeaseHeld",
    "LeaseInfo",
    "LeaseLost",
    "LimitReached",
    "MessageRecord",
    "MessageStatusMismatch",
    "NewItem",
    "NewRecord",
    "NoOpenCard",
    "NotFound",
    "OpenCard",
    "Page",
    "PayloadTooLarge",
    "PoppedItem",
    "RecordRole",
    "RecordStatus",
    "RecordUpdate",
    "RecordWrite",
    "ResolvedConversation",
    "ResourceExhausted",
    "SavedState",
    "ScopedStates",
    "StateClient",
    "StateError",
    "StateSnapshot",
    "TurnRequest",
    "Unavailable",
    "VersionConflict",
]
