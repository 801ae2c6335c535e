"""Checkpoints (issue 15): put (with its writes and run lease), get, list, writes, delete for
runs, copy, prune."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from agentstate.client.convert._common import Op, json_bytes, time_of
from agentstate.client.convert.leases import lease_of
from agentstate.client.types import (
    ChannelValue,
    CheckpointPut,
    CheckpointRunLease,
    CheckpointWrite,
    NewCheckpoint,
    Page,
    PruneStrategy,
    StoredCheckpoint,
)
from agentstate.state.v1 import state_service_pb2 as pb

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
        create_time=time_of(message.create_time),
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
    return Op("PutCheckpoint", request, lambda r: time_of(r.create_time))


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
            time_of(r.create_time), lease_of(r.lease) if r.HasField("lease") else None
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
