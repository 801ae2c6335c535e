"""The public Python client of the state service.

    from agentstate.client import AsyncStateClient, StateClient, VersionConflict

    with StateClient.connect("127.0.0.1:50051") as state:
        conversation = state.resolve_conversation("alice", "thread-42").conversation
        saved = state.upsert_state("alice", conversation.conversation_id, {"n": 1},
                                   expected_version=0)

Types (agentstate.client.types) carry no protobuf; state payloads are UTF-8 JSON bytes
(a mapping is serialised on the way in). Failures raise agentstate.client.errors'
exceptions, all subclasses of StateError. This package imports neither service.

The names below are loaded on first use: importing agentstate.client.types (as the agent
runtime does) loads neither grpc nor a generated stub.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Where each public name is defined.
_EXPORTS: dict[str, str] = {
    "AsyncStateClient": "agentstate.client.aio",
    "AlreadyExists": "agentstate.client.errors",
    "CardAlreadyHandled": "agentstate.client.errors",
    "CardPending": "agentstate.client.errors",
    "CheckpointConflict": "agentstate.client.errors",
    "DeadlineExceeded": "agentstate.client.errors",
    "FailedPrecondition": "agentstate.client.errors",
    "InternalError": "agentstate.client.errors",
    "InvalidArgument": "agentstate.client.errors",
    "LeaseHeld": "agentstate.client.errors",
    "LeaseLost": "agentstate.client.errors",
    "LimitReached": "agentstate.client.errors",
    "MessageStatusMismatch": "agentstate.client.errors",
    "ContextNotArray": "agentstate.client.errors",
    "NotSupported": "agentstate.client.errors",
    "ErasureRunning": "agentstate.client.errors",
    "UserBeingErased": "agentstate.client.errors",
    "PermissionDenied": "agentstate.client.errors",
    "NotFound": "agentstate.client.errors",
    "PayloadTooLarge": "agentstate.client.errors",
    "Unauthenticated": "agentstate.client.errors",
    "ResourceExhausted": "agentstate.client.errors",
    "StateError": "agentstate.client.errors",
    "TargetHasCheckpoints": "agentstate.client.errors",
    "CheckpointNotStored": "agentstate.client.errors",
    "Unavailable": "agentstate.client.errors",
    "VersionConflict": "agentstate.client.errors",
    "ClientSettings": "agentstate.client.settings",
    "ChannelSecurity": "agentstate.client.tls",
    "StateClient": "agentstate.client.sync",
    "AcquiredLease": "agentstate.client.types",
    "AppendedEvent": "agentstate.client.types",
    "AppendedItems": "agentstate.client.types",
    "BegunTurn": "agentstate.client.types",
    "CardGuard": "agentstate.client.types",
    "ChannelValue": "agentstate.client.types",
    "CheckpointPut": "agentstate.client.types",
    "CheckpointRunLease": "agentstate.client.types",
    "CheckpointWrite": "agentstate.client.types",
    "ClearedItems": "agentstate.client.types",
    "Compaction": "agentstate.client.types",
    "CompactionNote": "agentstate.client.types",
    "Conversation": "agentstate.client.types",
    "ConversationSearch": "agentstate.client.types",
    "ErasureReceipt": "agentstate.client.types",
    "Deleted": "agentstate.client.types",
    "Item": "agentstate.client.types",
    "ItemsPage": "agentstate.client.types",
    "LeaseInfo": "agentstate.client.types",
    "MessageRecord": "agentstate.client.types",
    "NewCheckpoint": "agentstate.client.types",
    "NewItem": "agentstate.client.types",
    "NewMessage": "agentstate.client.types",
    "NoOpenCard": "agentstate.client.types",
    "OpenCard": "agentstate.client.types",
    "Page": "agentstate.client.types",
    "PoppedItem": "agentstate.client.types",
    "PruneStrategy": "agentstate.client.types",
    "MessageRole": "agentstate.client.types",
    "MessageStatus": "agentstate.client.types",
    "MessageUpdate": "agentstate.client.types",
    "MessageWrite": "agentstate.client.types",
    "ResolvedConversation": "agentstate.client.types",
    "SavedState": "agentstate.client.types",
    "ScopedStates": "agentstate.client.types",
    "StateChange": "agentstate.client.types",
    "StateSnapshot": "agentstate.client.types",
    "StoredCheckpoint": "agentstate.client.types",
    "TurnRequest": "agentstate.client.types",
}

if TYPE_CHECKING:
    from agentstate.client.aio import (
        AsyncStateClient as AsyncStateClient,
    )
    from agentstate.client.errors import (
        AlreadyExists as AlreadyExists,
    )
    from agentstate.client.errors import (
        CardAlreadyHandled as CardAlreadyHandled,
    )
    from agentstate.client.errors import (
        CardPending as CardPending,
    )
    from agentstate.client.errors import (
        CheckpointConflict as CheckpointConflict,
    )
    from agentstate.client.errors import (
        CheckpointNotStored as CheckpointNotStored,
    )
    from agentstate.client.errors import (
        ContextNotArray as ContextNotArray,
    )
    from agentstate.client.errors import (
        DeadlineExceeded as DeadlineExceeded,
    )
    from agentstate.client.errors import (
        ErasureRunning as ErasureRunning,
    )
    from agentstate.client.errors import (
        FailedPrecondition as FailedPrecondition,
    )
    from agentstate.client.errors import (
        InternalError as InternalError,
    )
    from agentstate.client.errors import (
        InvalidArgument as InvalidArgument,
    )
    from agentstate.client.errors import (
        LeaseHeld as LeaseHeld,
    )
    from agentstate.client.errors import (
        LeaseLost as LeaseLost,
    )
    from agentstate.client.errors import (
        LimitReached as LimitReached,
    )
    from agentstate.client.errors import (
        MessageStatusMismatch as MessageStatusMismatch,
    )
    from agentstate.client.errors import (
        NotFound as NotFound,
    )
    from agentstate.client.errors import (
        NotSupported as NotSupported,
    )
    from agentstate.client.errors import (
        PayloadTooLarge as PayloadTooLarge,
    )
    from agentstate.client.errors import (
        PermissionDenied as PermissionDenied,
    )
    from agentstate.client.errors import (
        ResourceExhausted as ResourceExhausted,
    )
    from agentstate.client.errors import (
        StateError as StateError,
    )
    from agentstate.client.errors import (
        TargetHasCheckpoints as TargetHasCheckpoints,
    )
    from agentstate.client.errors import (
        Unauthenticated as Unauthenticated,
    )
    from agentstate.client.errors import (
        Unavailable as Unavailable,
    )
    from agentstate.client.errors import (
        UserBeingErased as UserBeingErased,
    )
    from agentstate.client.errors import (
        VersionConflict as VersionConflict,
    )
    from agentstate.client.settings import (
        ClientSettings as ClientSettings,
    )
    from agentstate.client.sync import (
        StateClient as StateClient,
    )
    from agentstate.client.tls import (
        ChannelSecurity as ChannelSecurity,
    )
    from agentstate.client.types import (
        AcquiredLease as AcquiredLease,
    )
    from agentstate.client.types import (
        AppendedEvent as AppendedEvent,
    )
    from agentstate.client.types import (
        AppendedItems as AppendedItems,
    )
    from agentstate.client.types import (
        BegunTurn as BegunTurn,
    )
    from agentstate.client.types import (
        CardGuard as CardGuard,
    )
    from agentstate.client.types import (
        ChannelValue as ChannelValue,
    )
    from agentstate.client.types import (
        CheckpointPut as CheckpointPut,
    )
    from agentstate.client.types import (
        CheckpointRunLease as CheckpointRunLease,
    )
    from agentstate.client.types import (
        CheckpointWrite as CheckpointWrite,
    )
    from agentstate.client.types import (
        ClearedItems as ClearedItems,
    )
    from agentstate.client.types import (
        Compaction as Compaction,
    )
    from agentstate.client.types import (
        CompactionNote as CompactionNote,
    )
    from agentstate.client.types import (
        Conversation as Conversation,
    )
    from agentstate.client.types import (
        ConversationSearch as ConversationSearch,
    )
    from agentstate.client.types import (
        Deleted as Deleted,
    )
    from agentstate.client.types import (
        ErasureReceipt as ErasureReceipt,
    )
    from agentstate.client.types import (
        Item as Item,
    )
    from agentstate.client.types import (
        ItemsPage as ItemsPage,
    )
    from agentstate.client.types import (
        LeaseInfo as LeaseInfo,
    )
    from agentstate.client.types import (
        MessageRecord as MessageRecord,
    )
    from agentstate.client.types import (
        MessageRole as MessageRole,
    )
    from agentstate.client.types import (
        MessageStatus as MessageStatus,
    )
    from agentstate.client.types import (
        MessageUpdate as MessageUpdate,
    )
    from agentstate.client.types import (
        MessageWrite as MessageWrite,
    )
    from agentstate.client.types import (
        NewCheckpoint as NewCheckpoint,
    )
    from agentstate.client.types import (
        NewItem as NewItem,
    )
    from agentstate.client.types import (
        NewMessage as NewMessage,
    )

    # Deprecated (agentstate.client.types.DEPRECATED_NAMES): they warn when used.
    from agentstate.client.types import (
        NewRecord as NewRecord,
    )
    from agentstate.client.types import (
        NoOpenCard as NoOpenCard,
    )
    from agentstate.client.types import (
        OpenCard as OpenCard,
    )
    from agentstate.client.types import (
        Page as Page,
    )
    from agentstate.client.types import (
        PoppedItem as PoppedItem,
    )
    from agentstate.client.types import (
        PruneStrategy as PruneStrategy,
    )
    from agentstate.client.types import (
        RecordRole as RecordRole,
    )
    from agentstate.client.types import (
        RecordStatus as RecordStatus,
    )
    from agentstate.client.types import (
        RecordUpdate as RecordUpdate,
    )
    from agentstate.client.types import (
        RecordWrite as RecordWrite,
    )
    from agentstate.client.types import (
        ResolvedConversation as ResolvedConversation,
    )
    from agentstate.client.types import (
        SavedState as SavedState,
    )
    from agentstate.client.types import (
        ScopedStates as ScopedStates,
    )
    from agentstate.client.types import (
        StateChange as StateChange,
    )
    from agentstate.client.types import (
        StateSnapshot as StateSnapshot,
    )
    from agentstate.client.types import (
        StoredCheckpoint as StoredCheckpoint,
    )
    from agentstate.client.types import (
        TurnRequest as TurnRequest,
    )
else:
    # Hidden from type checkers, so that a misspelt name is still an error to them.

    def __getattr__(name: str) -> Any:
        if name in _EXPORTS:
            value = getattr(importlib.import_module(_EXPORTS[name]), name)
            globals()[name] = value  # once: later lookups do not come here
            return value
        types = importlib.import_module("agentstate.client.types")
        if name in types.DEPRECATED_NAMES:
            return getattr(types, name)  # warns
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted([*globals(), *_EXPORTS])


__all__ = sorted(_EXPORTS)
