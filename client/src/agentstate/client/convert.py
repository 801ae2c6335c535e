"""Requests and responses of every StateService RPC, built and parsed once.

Each function returns an `Op`: the RPC's name, its request message and how to read its
response. AsyncStateClient and StateClient only send it (so the sync and async clients
share every line of translation). Internal: the public surface is agentstate.client.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from agentstate.client.types import (
    AcquiredLease,
    AppendedEvent,
    AppendedItems,
    BegunTurn,
    ChannelValue,
    CheckpointPut,
    CheckpointRunLease,
    CheckpointWrite,
    ClearedItems,
    Compaction,
    CompactionNote,
    Conversation,
    ConversationSearch,
    Deleted,
    ErasureReceipt,
    Item,
    ItemsPage,
    LeaseInfo,
    MessageRecord,
    MessageRole,
    MessageStatus,
    MessageUpdate,
    MessageWrite,
    NewCheckpoint,
    NewItem,
    NewMessage,
    NoOpenCard,
    OpenCard,
    Page,
    PoppedItem,
    PruneStrategy,
    ResolvedConversation,
    SavedState,
    ScopedStates,
    StateChange,
    StateSnapshot,
    StoredCheckpoint,
    TurnRequest,
)
from agentstate.state.v1 import state_service_pb2 as pb

R = TypeVar("R")
Payload = bytes | Mapping[str, Any]


@dataclass(frozen=True)
class Op(Generic[R]):
    method: str  # the StateService RPC
    request: Message
    parse: Callable[[Any], R]


_ROLES = {
    MessageRole.USER: pb.MESSAGE_ROLE_USER,
    MessageRole.ASSISTANT: pb.MESSAGE_ROLE_ASSISTANT,
}
_STATUSES = {
    MessageStatus.NORMAL: pb.MESSAGE_STATUS_NORMAL,
    MessageStatus.AWAITING_CONFIRM: pb.MESSAGE_STATUS_AWAITING_CONFIRM,
    MessageStatus.INTERRUPTED: pb.MESSAGE_STATUS_INTERRUPTED,
    MessageStatus.ERROR: pb.MESSAGE_STATUS_ERROR,
    MessageStatus.STREAMING: pb.MESSAGE_STATUS_STREAMING,
}
_ROLE_OF = {v: k for k, v in _ROLES.items()}
_STATUS_OF = {v: k for k, v in _STATUSES.items()}


def json_bytes(value: Any) -> bytes:
    """Compact UTF-8 JSON; NaN and infinities are refused (they are not JSON)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def payload_bytes(payload: Payload) -> bytes:
    """A state payload as UTF-8 JSON bytes (a mapping is serialised)."""
    return payload if isinstance(payload, bytes) else json_bytes(payload)


def _status(status: MessageStatus | None) -> pb.MessageStatus.ValueType:
    return pb.MESSAGE_STATUS_UNSPECIFIED if status is None else _STATUSES[status]


def new_message_pb(record: NewMessage) -> pb.NewMessage:
    return pb.NewMessage(
        role=_ROLES[record.role],
        blocks_json=json_bytes(record.blocks),
        status=_STATUSES[record.status],
        metadata_json=json_bytes(record.metadata),
    )


def message_update_pb(update: MessageUpdate) -> pb.MessageUpdate:
    message = pb.MessageUpdate(
        message_id=update.message_id,
        status=_status(update.status),
        expected_status=_status(update.expected_status),
    )
    if update.blocks is not None:
        message.blocks_json = json_bytes(update.blocks)
    if update.metadata is not None:
        message.metadata_json = json_bytes(update.metadata)
    return message


def message_write_pb(write: MessageWrite) -> pb.MessageWrite:
    if isinstance(write, NewMessage):
        return pb.MessageWrite(insert=new_message_pb(write))
    return pb.MessageWrite(update=message_update_pb(write))


def compaction_pb(note: CompactionNote) -> pb.CompactionRecord:
    return pb.CompactionRecord(
        messages_before=note.messages_before,
        messages_after=note.messages_after,
        tokens_before=note.tokens_before,
        tokens_after=note.tokens_after,
        summary_chars=note.summary_chars,
        reason=note.reason,
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _time(value: Timestamp) -> datetime:
    # As value.ToDatetime(tzinfo=UTC) (microseconds, nanos truncated), at half its cost:
    # a page of items holds two times per item.
    return _EPOCH + timedelta(seconds=value.seconds, microseconds=value.nanos // 1000)


_CONVERSATION_STATUS = {
    pb.CONVERSATION_STATUS_IDLE: "IDLE",
    pb.CONVERSATION_STATUS_RUNNING: "RUNNING",
    pb.CONVERSATION_STATUS_AWAITING_CONFIRMATION: "AWAITING_CONFIRMATION",
    pb.CONVERSATION_STATUS_FAILED: "FAILED",
}


def conversation_of(message: pb.Conversation) -> Conversation:
    return Conversation(
        conversation_id=message.conversation_id,
        title=message.title,
        create_time=_time(message.create_time),
        update_time=_time(message.update_time),
        user_id=message.user_id,
        external_key=message.external_key,
        labels=dict(message.labels),
        status=_CONVERSATION_STATUS.get(message.status, "IDLE"),
        last_turn_time=(
            _time(message.last_turn_time) if message.HasField("last_turn_time") else None
        ),
        ttl_seconds=message.ttl.seconds,
        ttl_renewed_by_writes=message.ttl.policy == pb.TTL_POLICY_RENEW_ON_WRITE,
        expire_time=_time(message.expire_time) if message.HasField("expire_time") else None,
    )


def ttl_of(seconds: int | None, renewed_by_writes: bool) -> pb.TimeToLive | None:
    if seconds is None:
        return None
    policy = pb.TTL_POLICY_RENEW_ON_WRITE if renewed_by_writes else pb.TTL_POLICY_FIXED
    return pb.TimeToLive(seconds=seconds, policy=policy)


def search_conversations(
    user_id: str,
    *,
    page_size: int,
    page_token: str,
    key_prefix: str,
    label_selector: str,
    statuses: Sequence[str],
    updated_after: datetime | None,
    updated_before: datetime | None,
    title_prefix: str,
    include_total: bool,
    all_users: bool,
    include_state_key: str,
) -> Op[ConversationSearch]:
    by_name = {name: value for value, name in _CONVERSATION_STATUS.items()}
    request = pb.ListConversationsRequest(
        user_id=user_id,
        page_size=page_size,
        page_token=page_token,
        key_prefix=key_prefix,
        label_selector=label_selector,
        statuses=[by_name.get(s, pb.CONVERSATION_STATUS_UNSPECIFIED) for s in statuses],
        title_prefix=title_prefix,
        include_total=include_total,
        all_users=all_users,
        include_state_key=include_state_key,
    )
    if updated_after is not None:
        request.updated_after.FromDatetime(updated_after)
    if updated_before is not None:
        request.updated_before.FromDatetime(updated_before)
    return Op(
        "ListConversations",
        request,
        lambda r: ConversationSearch(
            [conversation_of(c) for c in r.conversations],
            r.next_page_token,
            int(r.total_count),
            dict(r.states_json),
        ),
    )


def update_conversation(
    user_id: str,
    conversation_id: str,
    *,
    set_labels: Mapping[str, str],
    remove_labels: Sequence[str],
    ttl_seconds: int | None,
    ttl_renewed_by_writes: bool,
    clear_ttl: bool,
) -> Op[Conversation]:
    return Op(
        "UpdateConversation",
        pb.UpdateConversationRequest(
            user_id=user_id,
            conversation_id=conversation_id,
            set_labels=dict(set_labels),
            remove_labels=list(remove_labels),
            ttl=ttl_of(ttl_seconds, ttl_renewed_by_writes),
            clear_ttl=clear_ttl,
        ),
        lambda r: conversation_of(r.conversation),
    )


def _receipt_of(message: pb.ErasureReceipt) -> ErasureReceipt:
    return ErasureReceipt(
        erasure_id=message.erasure_id,
        done=message.state == pb.ERASURE_STATE_DONE,
        counts=dict(message.counts),
        start_time=_time(message.start_time),
        end_time=_time(message.end_time) if message.HasField("end_time") else None,
    )


def erase_user(user_id: str) -> Op[ErasureReceipt]:
    return Op("EraseUser", pb.EraseUserRequest(user_id=user_id), lambda r: _receipt_of(r.receipt))


def get_erasure_receipt(erasure_id: str) -> Op[ErasureReceipt]:
    return Op(
        "GetErasureReceipt",
        pb.GetErasureReceiptRequest(erasure_id=erasure_id),
        lambda r: _receipt_of(r.receipt),
    )


def record_of(message: pb.MessageRecord) -> MessageRecord:
    return MessageRecord(
        message_id=message.message_id,
        conversation_id=message.conversation_id,
        role=_ROLE_OF[message.role],
        blocks_json=message.blocks_json,
        status=_STATUS_OF[message.status],
        metadata_json=message.metadata_json,
        create_time=_time(message.create_time),
        update_time=_time(message.update_time),
    )


def lease_of(message: pb.Lease) -> LeaseInfo:
    return LeaseInfo(
        task_id=message.task_id,
        conversation_id=message.conversation_id,
        stop_requested=message.stop_requested,
        expire_time=_time(message.expire_time),
        holder=message.holder,
        acquire_time=_time(message.acquire_time) if message.HasField("acquire_time") else None,
    )


def _compaction_of(message: pb.CompactionRecord) -> Compaction:
    note = CompactionNote(
        messages_before=message.messages_before,
        messages_after=message.messages_after,
        tokens_before=message.tokens_before,
        tokens_after=message.tokens_after,
        summary_chars=message.summary_chars,
        reason=message.reason,
    )
    created = _time(message.create_time) if message.HasField("create_time") else None
    return Compaction(message.compaction_id, note, created)


def _deleted(response: Any) -> Deleted:
    return Deleted(
        conversations=int(response.conversations_deleted),
        messages=int(response.messages_deleted),
        states=int(response.states_deleted),
    )


def _saved(response: Any) -> SavedState:
    return SavedState(
        version=int(response.version),
        update_time=_time(response.update_time),
        records=[record_of(m) for m in response.messages],
        lease_released=bool(getattr(response, "lease_released", False)),
    )


# ------------------------------------------------------------------- state


def get_state(user_id: str, conversation_id: str, state_key: str) -> Op[StateSnapshot]:
    return Op(
        "GetState",
        pb.GetStateRequest(user_id=user_id, conversation_id=conversation_id, state_key=state_key),
        lambda r: StateSnapshot(r.payload, int(r.version), _time(r.update_time)),
    )


def state_delta_pb(change: StateChange) -> pb.StateDelta:
    delta = pb.StateDelta(
        base_version=change.base_version, drop_head=change.drop_head, messages=change.messages
    )
    if change.replace_from is not None:
        delta.replace_from = change.replace_from
    if change.fields_json is not None:
        delta.fields_json = change.fields_json
    return delta


def _state_of(
    request: pb.UpsertStateRequest | pb.EndTurnRequest,
    payload: Payload | None,
    expected_version: int | None,
    delta: StateChange | None,
) -> None:
    """The whole payload (with its compare-and-set), or a delta (which carries its own)."""
    if delta is not None:
        if payload is not None or expected_version is not None:
            raise ValueError("send a payload (with expected_version) or a delta, not both")
        request.delta.CopyFrom(state_delta_pb(delta))
        return
    if payload is None:
        raise ValueError("a save needs a payload or a delta")
    request.payload = payload_bytes(payload)
    if expected_version is not None:
        request.expected_version = expected_version


def upsert_state(
    user_id: str,
    conversation_id: str,
    payload: Payload | None,
    *,
    expected_version: int | None,
    state_key: str,
    writes: Sequence[MessageWrite],
    compactions: Sequence[CompactionNote],
    delta: StateChange | None = None,
) -> Op[SavedState]:
    request = pb.UpsertStateRequest(
        user_id=user_id,
        conversation_id=conversation_id,
        state_key=state_key,
        message_writes=[message_write_pb(w) for w in writes],
        compaction_records=[compaction_pb(c) for c in compactions],
    )
    _state_of(request, payload, expected_version, delta)
    return Op("UpsertState", request, _saved)


# ----------------------------------------------------------- conversations


def create_conversation(
    user_id: str,
    title: str,
    external_key: str,
    labels: Mapping[str, str] | None = None,
    ttl: pb.TimeToLive | None = None,
) -> Op[Conversation]:
    return Op(
        "CreateConversation",
        pb.CreateConversationRequest(
            user_id=user_id, title=title, external_key=external_key, labels=labels, ttl=ttl
        ),
        lambda r: conversation_of(r.conversation),
    )


def resolve_conversation(
    user_id: str,
    external_key: str,
    create: bool,
    title: str,
    labels: Mapping[str, str] | None = None,
    ttl: pb.TimeToLive | None = None,
) -> Op[ResolvedConversation]:
    return Op(
        "ResolveConversation",
        pb.ResolveConversationRequest(
            user_id=user_id,
            external_key=external_key,
            create_if_missing=create,
            title=title,
            labels=labels,
            ttl=ttl,
        ),
        lambda r: ResolvedConversation(conversation_of(r.conversation), bool(r.created)),
    )


def get_conversation(user_id: str, conversation_id: str) -> Op[Conversation]:
    return Op(
        "GetConversation",
        pb.GetConversationRequest(user_id=user_id, conversation_id=conversation_id),
        lambda r: conversation_of(r.conversation),
    )


def list_conversations(user_id: str, page_size: int, page_token: str) -> Op[Page[Conversation]]:
    return Op(
        "ListConversations",
        pb.ListConversationsRequest(user_id=user_id, page_size=page_size, page_token=page_token),
        lambda r: Page([conversation_of(c) for c in r.conversations], r.next_page_token),
    )


def rename_conversation(user_id: str, conversation_id: str, title: str) -> Op[Conversation]:
    return Op(
        "RenameConversation",
        pb.RenameConversationRequest(user_id=user_id, conversation_id=conversation_id, title=title),
        lambda r: conversation_of(r.conversation),
    )


def delete_conversation(user_id: str, conversation_id: str) -> Op[Deleted]:
    return Op(
        "DeleteConversation",
        pb.DeleteConversationRequest(user_id=user_id, conversation_id=conversation_id),
        _deleted,
    )


def delete_conversations(user_id: str, conversation_ids: Sequence[str]) -> Op[Deleted]:
    return Op(
        "BatchDeleteConversations",
        pb.BatchDeleteConversationsRequest(
            user_id=user_id, conversation_ids=list(conversation_ids)
        ),
        _deleted,
    )


# ---------------------------------------------------------------- messages


def append_message(user_id: str, conversation_id: str, record: NewMessage) -> Op[MessageRecord]:
    return Op(
        "AppendMessage",
        pb.AppendMessageRequest(
            user_id=user_id, conversation_id=conversation_id, message=new_message_pb(record)
        ),
        lambda r: record_of(r.message),
    )


def update_message(user_id: str, conversation_id: str, update: MessageUpdate) -> Op[MessageRecord]:
    return Op(
        "UpdateMessage",
        pb.UpdateMessageRequest(
            user_id=user_id, conversation_id=conversation_id, update=message_update_pb(update)
        ),
        lambda r: record_of(r.message),
    )


def get_message(user_id: str, conversation_id: str, message_id: str) -> Op[MessageRecord]:
    return Op(
        "GetMessage",
        pb.GetMessageRequest(
            user_id=user_id, conversation_id=conversation_id, message_id=message_id
        ),
        lambda r: record_of(r.message),
    )


def list_messages(
    user_id: str, conversation_id: str, page_size: int, page_token: str, newest_first: bool
) -> Op[Page[MessageRecord]]:
    return Op(
        "ListMessages",
        pb.ListMessagesRequest(
            user_id=user_id,
            conversation_id=conversation_id,
            page_size=page_size,
            page_token=page_token,
            newest_first=newest_first,
        ),
        lambda r: Page([record_of(m) for m in r.messages], r.next_page_token),
    )


def list_compactions(user_id: str, conversation_id: str) -> Op[list[Compaction]]:
    return Op(
        "ListCompactions",
        pb.ListCompactionsRequest(user_id=user_id, conversation_id=conversation_id),
        lambda r: [_compaction_of(c) for c in r.compactions],
    )


# ------------------------------------------------------------------ leases


def acquire_lease(
    user_id: str, conversation_id: str, holder: str, ttl_ms: int, max_user_leases: int
) -> Op[AcquiredLease]:
    return Op(
        "AcquireLease",
        pb.AcquireLeaseRequest(
            user_id=user_id,
            conversation_id=conversation_id,
            holder=holder,
            ttl_ms=ttl_ms,
            max_user_leases=max_user_leases,
        ),
        lambda r: AcquiredLease(lease_of(r.lease), r.lapsed_task_id),
    )


def get_lease(user_id: str, conversation_id: str) -> Op[LeaseInfo | None]:
    return Op(
        "GetLease",
        pb.GetLeaseRequest(user_id=user_id, conversation_id=conversation_id),
        lambda r: lease_of(r.lease) if r.HasField("lease") else None,
    )


def renew_lease(user_id: str, task_id: str, ttl_ms: int) -> Op[LeaseInfo]:
    return Op(
        "RenewLease",
        pb.RenewLeaseRequest(user_id=user_id, task_id=task_id, ttl_ms=ttl_ms),
        lambda r: lease_of(r.lease),
    )


def release_lease(user_id: str, task_id: str) -> Op[bool]:
    return Op(
        "ReleaseLease",
        pb.ReleaseLeaseRequest(user_id=user_id, task_id=task_id),
        lambda r: bool(r.released),
    )


def request_stop(user_id: str, task_id: str) -> Op[LeaseInfo]:
    return Op(
        "RequestStop",
        pb.RequestStopRequest(user_id=user_id, task_id=task_id),
        lambda r: lease_of(r.lease),
    )


# ------------------------------------------------------------------- turns


def _begun(response: pb.BeginTurnResponse) -> BegunTurn:
    state = None
    if response.version:
        state = StateSnapshot(
            response.payload, int(response.version), _time(response.state_update_time)
        )
    return BegunTurn(
        conversation=conversation_of(response.conversation),
        conversation_created=response.conversation_created,
        lease=lease_of(response.lease),
        lapsed_task_id=response.lapsed_task_id,
        interrupted_records=response.interrupted_records,
        state=state,
        records=[record_of(m) for m in response.messages],
        payload_omitted=response.payload_omitted,
    )


def begin_turn(request: TurnRequest) -> Op[BegunTurn]:
    message = pb.BeginTurnRequest(
        user_id=request.user_id,
        conversation_id=request.conversation_id,
        title=request.title,
        state_key=request.state_key,
        holder=request.holder,
        ttl_ms=request.ttl_ms,
        max_user_leases=request.max_user_leases,
        new_messages=[new_message_pb(r) for r in request.new_records],
    )
    if request.cached_version is not None:
        message.cached_version = request.cached_version
    if isinstance(request.guard, NoOpenCard):
        message.require_none_awaiting = True
    elif isinstance(request.guard, OpenCard):
        message.require_awaiting_message_id = request.guard.message_id
    return Op("BeginTurn", message, _begun)


def end_turn(
    user_id: str,
    conversation_id: str,
    task_id: str,
    payload: Payload | None,
    *,
    expected_version: int | None,
    state_key: str,
    writes: Sequence[MessageWrite],
    compactions: Sequence[CompactionNote],
    delta: StateChange | None = None,
) -> Op[SavedState]:
    request = pb.EndTurnRequest(
        user_id=user_id,
        conversation_id=conversation_id,
        task_id=task_id,
        state_key=state_key,
        message_writes=[message_write_pb(w) for w in writes],
        compaction_records=[compaction_pb(c) for c in compactions],
    )
    _state_of(request, payload, expected_version, delta)
    return Op("EndTurn", request, _saved)


# ------------------------------------------------------ checkpoints (issue 15)

_PRUNE = {
    PruneStrategy.KEEP_LATEST: pb.PRUNE_STRATEGY_KEEP_LATEST,
    PruneStrategy.DELETE_ALL: pb.PRUNE_STRATEGY_DELETE_ALL,
}


def _channel_value_pb(value: ChannelValue) -> pb.ChannelValue:
    return pb.ChannelValue(
        channel=value.channel, version=value.version, value_type=value.value_type, value=value.value
    )


def _checkpoint_write_pb(write: CheckpointWrite) -> pb.CheckpointWrite:
    return pb.CheckpointWrite(
        task_id=write.task_id,
        idx=write.idx,
        channel=write.channel,
        value_type=write.value_type,
        value=write.value,
        task_path=write.task_path,
    )


def checkpoint_of(message: pb.Checkpoint) -> StoredCheckpoint:
    return StoredCheckpoint(
        conversation_id=message.conversation_id,
        namespace=message.namespace,
        checkpoint_id=message.checkpoint_id,
        parent_checkpoint_id=message.parent_checkpoint_id,
        checkpoint_type=message.checkpoint_type,
        checkpoint=message.checkpoint,
        metadata_json=message.metadata_json,
        channel_versions=dict(message.channel_versions),
        channel_values=[
            ChannelValue(v.channel, v.version, v.value_type, v.value)
            for v in message.channel_values
        ],
        pending_writes=[
            CheckpointWrite(w.task_id, w.idx, w.channel, w.value_type, w.value, w.task_path)
            for w in message.pending_writes
        ],
        create_time=_time(message.create_time),
    )


def put_checkpoint(
    user_id: str, conversation_id: str, checkpoint: NewCheckpoint, expected_head: str | None
) -> Op[datetime]:
    request = pb.PutCheckpointRequest(
        user_id=user_id,
        conversation_id=conversation_id,
        namespace=checkpoint.namespace,
        checkpoint_id=checkpoint.checkpoint_id,
        parent_checkpoint_id=checkpoint.parent_checkpoint_id,
        checkpoint_type=checkpoint.checkpoint_type,
        checkpoint=checkpoint.checkpoint,
        metadata_json=checkpoint.metadata_json,
        channel_versions=checkpoint.channel_versions,
        new_channel_values=[_channel_value_pb(v) for v in checkpoint.new_values],
    )
    if expected_head is not None:
        request.expected_head_checkpoint_id = expected_head
    return Op("PutCheckpoint", request, lambda r: _time(r.create_time))


def put_checkpoint_step(
    user_id: str,
    conversation_id: str,
    checkpoint: NewCheckpoint,
    expected_head: str | None,
    parent_writes: Sequence[CheckpointWrite],
    run_lease: CheckpointRunLease | None,
) -> Op[CheckpointPut]:
    request = put_checkpoint(user_id, conversation_id, checkpoint, expected_head).request
    assert isinstance(request, pb.PutCheckpointRequest)
    request.parent_writes.extend(_checkpoint_write_pb(w) for w in parent_writes)
    if run_lease is not None:
        request.run_lease.CopyFrom(
            pb.CheckpointRunLease(
                holder=run_lease.holder,
                task_id=run_lease.task_id,
                ttl_ms=run_lease.ttl_ms,
                release=run_lease.release,
            )
        )
    return Op(
        "PutCheckpoint",
        request,
        lambda r: CheckpointPut(
            _time(r.create_time), lease_of(r.lease) if r.HasField("lease") else None
        ),
    )


def get_checkpoint(
    user_id: str, conversation_id: str, namespace: str, checkpoint_id: str
) -> Op[StoredCheckpoint | None]:
    return Op(
        "GetCheckpoint",
        pb.GetCheckpointRequest(
            user_id=user_id,
            conversation_id=conversation_id,
            namespace=namespace,
            checkpoint_id=checkpoint_id,
        ),
        lambda r: checkpoint_of(r.checkpoint) if r.HasField("checkpoint") else None,
    )


def list_checkpoints(
    user_id: str,
    conversation_id: str,
    namespace: str | None,
    metadata_filter: Mapping[str, Any] | None,
    before_checkpoint_id: str,
    page_size: int,
    page_token: str,
) -> Op[Page[StoredCheckpoint]]:
    request = pb.ListCheckpointsRequest(
        user_id=user_id,
        conversation_id=conversation_id,
        metadata_filter_json=json_bytes(metadata_filter) if metadata_filter else b"",
        before_checkpoint_id=before_checkpoint_id,
        page_size=page_size,
        page_token=page_token,
    )
    if namespace is not None:
        request.namespace = namespace
    return Op(
        "ListCheckpoints",
        request,
        lambda r: Page([checkpoint_of(c) for c in r.checkpoints], r.next_page_token),
    )


def put_checkpoint_writes(
    user_id: str,
    conversation_id: str,
    namespace: str,
    checkpoint_id: str,
    writes: Sequence[CheckpointWrite],
) -> Op[int]:
    return Op(
        "PutCheckpointWrites",
        pb.PutCheckpointWritesRequest(
            user_id=user_id,
            conversation_id=conversation_id,
            namespace=namespace,
            checkpoint_id=checkpoint_id,
            writes=[_checkpoint_write_pb(w) for w in writes],
        ),
        lambda r: int(r.writes_stored),
    )


def delete_checkpoints_for_runs(user_id: str, run_ids: Sequence[str]) -> Op[int]:
    return Op(
        "DeleteCheckpointsForRuns",
        pb.DeleteCheckpointsForRunsRequest(user_id=user_id, run_ids=list(run_ids)),
        lambda r: int(r.checkpoints_deleted),
    )


def copy_checkpoints(
    user_id: str, source_conversation_id: str, target_conversation_id: str
) -> Op[int]:
    return Op(
        "CopyCheckpoints",
        pb.CopyCheckpointsRequest(
            user_id=user_id,
            source_conversation_id=source_conversation_id,
            target_conversation_id=target_conversation_id,
        ),
        lambda r: int(r.checkpoints_copied),
    )


def prune_checkpoints(
    user_id: str, conversation_ids: Sequence[str], strategy: PruneStrategy
) -> Op[int]:
    return Op(
        "PruneCheckpoints",
        pb.PruneCheckpointsRequest(
            user_id=user_id, conversation_ids=list(conversation_ids), strategy=_PRUNE[strategy]
        ),
        lambda r: int(r.checkpoints_deleted),
    )


# ------------------------------------------- conversation items, scoped state


def _timestamp(value: datetime) -> Timestamp:
    # As Timestamp.FromDatetime (a naive time is UTC), built from integers.
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    since = value - _EPOCH
    return Timestamp(seconds=since.days * 86400 + since.seconds, nanos=since.microseconds * 1000)


def new_item_pb(item: NewItem) -> pb.NewItem:
    message = pb.NewItem(item_json=payload_bytes(item.item))
    if item.item_time is not None:
        message.item_time.CopyFrom(_timestamp(item.item_time))
    return message


def item_of(message: pb.ConversationItem, item_json: bytes | None = None) -> Item:
    return Item(
        conversation_id=message.conversation_id,
        seq=int(message.seq),
        item_json=message.item_json if item_json is None else item_json,
        item_time=_time(message.item_time),
        create_time=_time(message.create_time),
    )


def _snapshot_of(message: pb.ScopedState) -> StateSnapshot:
    return StateSnapshot(message.payload, int(message.version), _time(message.update_time))


def append_items(
    user_id: str, conversation_id: str, items: Sequence[NewItem], expected_revision: int | None
) -> Op[AppendedItems]:
    # The service stores each item as the text sent: it need not send the texts back.
    request = pb.AppendItemsRequest(
        user_id=user_id,
        conversation_id=conversation_id,
        items=[new_item_pb(i) for i in items],
        omit_item_json=True,
    )
    if expected_revision is not None:
        request.expected_revision = expected_revision
    sent = [i.item_json for i in request.items]
    return Op(
        "AppendItems",
        request,
        lambda r: AppendedItems(
            [item_of(i, text) for i, text in zip(r.items, sent, strict=True)], int(r.revision)
        ),
    )


def list_items(
    user_id: str,
    conversation_id: str,
    *,
    last_n: int | None,
    min_item_time: datetime | None,
    page_size: int,
    page_token: str,
    include_state_key: str = "",
    include_scoped_app_name: str = "",
    after_seq: int | None = None,
) -> Op[ItemsPage]:
    request = pb.ListItemsRequest(
        user_id=user_id,
        conversation_id=conversation_id,
        page_size=page_size,
        page_token=page_token,
        include_state_key=include_state_key,
        include_scoped_app_name=include_scoped_app_name,
    )
    if last_n is not None:
        request.last_n = last_n
    if after_seq is not None:
        request.after_seq = after_seq
    if min_item_time is not None:
        request.min_item_time.CopyFrom(_timestamp(min_item_time))
    return Op(
        "ListItems",
        request,
        lambda r: ItemsPage(
            [item_of(i) for i in r.items],
            r.next_page_token,
            int(r.revision),
            _time(r.update_time),
            _snapshot_of(r.state) if r.HasField("state") else None,
            _scoped_of(r) if include_scoped_app_name else None,
        ),
    )


def _scoped_of(r: pb.ListItemsResponse | pb.GetScopedStateResponse) -> ScopedStates:
    return ScopedStates(
        _snapshot_of(r.app_state) if r.HasField("app_state") else None,
        _snapshot_of(r.user_state) if r.HasField("user_state") else None,
    )


def pop_item(user_id: str, conversation_id: str, expected_revision: int | None) -> Op[PoppedItem]:
    request = pb.PopItemRequest(user_id=user_id, conversation_id=conversation_id)
    if expected_revision is not None:
        request.expected_revision = expected_revision
    return Op(
        "PopItem",
        request,
        lambda r: PoppedItem(item_of(r.item) if r.HasField("item") else None, int(r.revision)),
    )


def clear_items(user_id: str, conversation_id: str) -> Op[ClearedItems]:
    return Op(
        "ClearItems",
        pb.ClearItemsRequest(user_id=user_id, conversation_id=conversation_id),
        lambda r: ClearedItems(int(r.items_deleted), int(r.revision)),
    )


def get_scoped_state(user_id: str, app_name: str) -> Op[ScopedStates]:
    return Op(
        "GetScopedState",
        pb.GetScopedStateRequest(user_id=user_id, app_name=app_name),
        _scoped_of,
    )


def append_event(
    user_id: str,
    conversation_id: str,
    *,
    item: NewItem | None,
    expected_revision: int | None,
    state_key: str,
    state_delta: Payload | None,
    app_name: str,
    app_state_delta: Payload | None,
    user_state_delta: Payload | None,
) -> Op[AppendedEvent]:
    request = pb.AppendEventRequest(
        user_id=user_id,
        conversation_id=conversation_id,
        state_key=state_key,
        app_name=app_name,
        state_delta_json=payload_bytes(state_delta) if state_delta is not None else b"",
        app_state_delta_json=payload_bytes(app_state_delta) if app_state_delta is not None else b"",
        user_state_delta_json=(
            payload_bytes(user_state_delta) if user_state_delta is not None else b""
        ),
    )
    if item is not None:
        request.item.CopyFrom(new_item_pb(item))
        request.omit_item_json = True  # stored as sent (as in append_items)
    if expected_revision is not None:
        request.expected_revision = expected_revision
    sent = request.item.item_json
    return Op(
        "AppendEvent",
        request,
        lambda r: AppendedEvent(
            item_of(r.item, sent) if r.HasField("item") else None,
            int(r.revision),
            int(r.state_version),
        ),
    )
