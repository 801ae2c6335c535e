"""LangGraph checkpoints (the checkpoints capability)."""

from __future__ import annotations

from typing import Any

import grpc

from agentstate.common.state_metrics import (
    LOAD_DURATION,
    SAVE_DURATION,
)
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state_service import domain as d
from agentstate.state_service.servicer.base import ServicerBase
from agentstate.state_service.servicer.leases import lease_to_pb
from agentstate.state_service.servicer.translate import grpc_errors, timed, timestamp

_PRUNE_TO_DOMAIN = {
    pb.PRUNE_STRATEGY_KEEP_LATEST: d.PruneStrategy.KEEP_LATEST,
    pb.PRUNE_STRATEGY_DELETE_ALL: d.PruneStrategy.DELETE_ALL,
}


def _namespace(value: str) -> str:
    return d.check_text(value, "namespace", d.MAX_NAMESPACE_CHARS)


def _checkpoint_id(value: str, what: str = "checkpoint_id", *, required: bool = True) -> str:
    return d.check_text(value, what, d.MAX_CHECKPOINT_ID_CHARS, required=required)


def channel_value_from_pb(value: pb.ChannelValue, what: str) -> d.ChannelValue:
    return d.ChannelValue(
        channel=d.check_text(value.channel, f"{what}.channel", 256, required=True),
        version=d.check_text(value.version, f"{what}.version", 256, required=True),
        value_type=d.check_text(value.value_type, f"{what}.value_type", d.MAX_SERIALIZER_TAG_CHARS),
        value=value.value,
    )


def checkpoint_write_from_pb(write: pb.CheckpointWrite, what: str) -> d.CheckpointWrite:
    return d.CheckpointWrite(
        task_id=d.check_text(write.task_id, f"{what}.task_id", 256, required=True),
        idx=write.idx,
        channel=d.check_text(write.channel, f"{what}.channel", 256, required=True),
        value_type=d.check_text(write.value_type, f"{what}.value_type", d.MAX_SERIALIZER_TAG_CHARS),
        value=write.value,
        task_path=d.check_text(write.task_path, f"{what}.task_path", d.MAX_TASK_PATH_CHARS),
    )


def run_lease_from_pb(lease: pb.CheckpointRunLease) -> d.CheckpointRunLease:
    """A put's use of the run lease: take it (holder), renew or release it (task_id)."""
    if lease.task_id:
        task_id = d.parse_id(lease.task_id, "run_lease.task_id")
        ttl_ms = d.validate_ttl_ms(lease.ttl_ms) if lease.ttl_ms else 0
        if not ttl_ms and not lease.release:
            raise d.InvalidArgument("run_lease with a task_id needs ttl_ms (renew) or release")
        return d.CheckpointRunLease(task_id=task_id, ttl_ms=ttl_ms, release=lease.release)
    try:
        holder = d.validate_holder(lease.holder)
    except d.InvalidArgument as exc:
        raise d.InvalidArgument(f"run_lease: {exc}") from None
    return d.CheckpointRunLease(
        holder=holder, ttl_ms=d.validate_ttl_ms(lease.ttl_ms), release=lease.release
    )


def checkpoint_to_pb(cp: d.StoredCheckpoint) -> pb.Checkpoint:
    return pb.Checkpoint(
        conversation_id=str(cp.conversation_id),
        namespace=cp.namespace,
        checkpoint_id=cp.checkpoint_id,
        parent_checkpoint_id=cp.parent_checkpoint_id or "",
        checkpoint_type=cp.checkpoint_type,
        checkpoint=cp.checkpoint,
        metadata_json=cp.metadata_json,
        channel_versions=cp.channel_versions,
        channel_values=[
            pb.ChannelValue(
                channel=v.channel, version=v.version, value_type=v.value_type, value=v.value
            )
            for v in cp.channel_values
        ],
        pending_writes=[
            pb.CheckpointWrite(
                task_id=w.task_id,
                idx=w.idx,
                channel=w.channel,
                value_type=w.value_type,
                value=w.value,
                task_path=w.task_path,
            )
            for w in cp.pending_writes
        ],
        create_time=timestamp(cp.create_time),
    )


class CheckpointRpcs(ServicerBase):
    @grpc_errors
    async def PutCheckpoint(
        self, request: pb.PutCheckpointRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PutCheckpointResponse:
        size = len(request.checkpoint) + len(request.metadata_json)
        size += sum(len(v.value) for v in request.new_channel_values)
        size += sum(len(w.value) for w in request.parent_writes)
        if len(request.parent_writes) > d.MAX_CHECKPOINT_WRITES:
            raise d.InvalidArgument(f"at most {d.MAX_CHECKPOINT_WRITES} parent_writes per call")
        if size > self._max_payload_bytes:
            raise d.PayloadTooLarge(
                f"checkpoint is {size} bytes, over the limit of {self._max_payload_bytes} bytes"
            )
        for channel, version in request.channel_versions.items():
            d.check_text(channel, "channel_versions key", 256, required=True)
            d.check_text(version, f"channel_versions[{channel!r}]", 256, required=True)
        expected: str | None = None
        if request.HasField("expected_head_checkpoint_id"):
            expected = _checkpoint_id(
                request.expected_head_checkpoint_id, "expected_head_checkpoint_id", required=False
            )
        checkpoint = d.NewCheckpoint(
            namespace=_namespace(request.namespace),
            checkpoint_id=_checkpoint_id(request.checkpoint_id),
            parent_checkpoint_id=_checkpoint_id(
                request.parent_checkpoint_id, "parent_checkpoint_id", required=False
            )
            or None,
            checkpoint_type=d.check_text(
                request.checkpoint_type, "checkpoint_type", d.MAX_SERIALIZER_TAG_CHARS
            ),
            checkpoint=request.checkpoint,
            metadata_json=d.check_metadata_json(request.metadata_json),
            channel_versions=dict(request.channel_versions),
            new_values=tuple(
                channel_value_from_pb(v, f"new_channel_values[{i}]")
                for i, v in enumerate(request.new_channel_values)
            ),
        )
        if request.parent_writes and not checkpoint.parent_checkpoint_id:
            raise d.InvalidArgument("parent_writes need a parent_checkpoint_id")
        parent_writes = [
            checkpoint_write_from_pb(w, f"parent_writes[{i}]")
            for i, w in enumerate(request.parent_writes)
        ]
        lease = run_lease_from_pb(request.run_lease) if request.HasField("run_lease") else None
        with timed(SAVE_DURATION):
            done = await self._checkpoints().put_checkpoint(
                user_id=d.validate_user_id(request.user_id),
                conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
                checkpoint=checkpoint,
                expected_head=expected,
                parent_writes=parent_writes,
                lease=lease,
            )
        response = pb.PutCheckpointResponse(create_time=timestamp(done.create_time))
        if done.lease is not None:
            response.lease.CopyFrom(lease_to_pb(done.lease))
        return response

    @grpc_errors
    async def GetCheckpoint(
        self, request: pb.GetCheckpointRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetCheckpointResponse:
        with timed(LOAD_DURATION):
            found = await self._checkpoints().get_checkpoint(
                user_id=d.validate_user_id(request.user_id),
                conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
                namespace=_namespace(request.namespace),
                checkpoint_id=_checkpoint_id(request.checkpoint_id, required=False) or None,
            )
        if found is None:
            return pb.GetCheckpointResponse()
        return pb.GetCheckpointResponse(checkpoint=checkpoint_to_pb(found))

    @grpc_errors
    async def ListCheckpoints(
        self, request: pb.ListCheckpointsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListCheckpointsResponse:
        metadata_filter = None
        if request.metadata_filter_json:
            metadata_filter = d.check_metadata_json(
                request.metadata_filter_json, "metadata_filter_json"
            )
            # A filter matches the metadata's searchable copy (d.metadata_search_copy):
            # values jsonb cannot hold are refused here, by both stores alike.
            d.check_jsonb(metadata_filter, dict, "metadata_filter_json")
        page = await self._checkpoints().list_checkpoints(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
            namespace=_namespace(request.namespace) if request.HasField("namespace") else None,
            metadata_filter=metadata_filter,
            before_checkpoint_id=_checkpoint_id(
                request.before_checkpoint_id, "before_checkpoint_id", required=False
            )
            or None,
            page_size=d.page_size(request.page_size, default=20, maximum=100),
            after=d.parse_checkpoint_page_token(request.page_token),
        )
        return pb.ListCheckpointsResponse(
            checkpoints=[checkpoint_to_pb(c) for c in page.items],
            next_page_token=page.next_page_token,
        )

    @grpc_errors
    async def PutCheckpointWrites(
        self, request: pb.PutCheckpointWritesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PutCheckpointWritesResponse:
        if len(request.writes) > d.MAX_CHECKPOINT_WRITES:
            raise d.InvalidArgument(f"at most {d.MAX_CHECKPOINT_WRITES} writes per call")
        size = sum(len(w.value) for w in request.writes)
        if size > self._max_payload_bytes:
            raise d.PayloadTooLarge(
                f"writes are {size} bytes, over the limit of {self._max_payload_bytes} bytes"
            )
        writes = [checkpoint_write_from_pb(w, f"writes[{i}]") for i, w in enumerate(request.writes)]
        stored = await self._checkpoints().put_checkpoint_writes(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
            namespace=_namespace(request.namespace),
            checkpoint_id=_checkpoint_id(request.checkpoint_id),
            writes=writes,
        )
        return pb.PutCheckpointWritesResponse(writes_stored=stored)

    @grpc_errors
    async def DeleteCheckpointsForRuns(
        self,
        request: pb.DeleteCheckpointsForRunsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.DeleteCheckpointsForRunsResponse:
        user_id = d.validate_user_id(request.user_id)
        if len(request.run_ids) > d.MAX_RUN_IDS:
            raise d.InvalidArgument(f"at most {d.MAX_RUN_IDS} run_ids per call")
        run_ids = [
            d.check_text(r, f"run_ids[{i}]", 256, required=True)
            for i, r in enumerate(request.run_ids)
        ]
        deleted = 0
        if run_ids:
            deleted = await self._checkpoints().delete_checkpoints_for_runs(
                user_id=user_id, run_ids=run_ids
            )
        return pb.DeleteCheckpointsForRunsResponse(checkpoints_deleted=deleted)

    @grpc_errors
    async def CopyCheckpoints(
        self, request: pb.CopyCheckpointsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CopyCheckpointsResponse:
        source = d.parse_id(request.source_conversation_id, "source_conversation_id")
        target = d.parse_id(request.target_conversation_id, "target_conversation_id")
        if source == target:
            raise d.InvalidArgument("source and target conversation must differ")
        copied = await self._checkpoints().copy_checkpoints(
            user_id=d.validate_user_id(request.user_id),
            source_conversation_id=source,
            target_conversation_id=target,
        )
        return pb.CopyCheckpointsResponse(checkpoints_copied=copied)

    @grpc_errors
    async def PruneCheckpoints(
        self, request: pb.PruneCheckpointsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PruneCheckpointsResponse:
        user_id = d.validate_user_id(request.user_id)
        strategy = _PRUNE_TO_DOMAIN.get(request.strategy)
        if strategy is None:
            raise d.InvalidArgument("strategy is required (KEEP_LATEST or DELETE_ALL)")
        if not request.conversation_ids:
            raise d.InvalidArgument("conversation_ids must not be empty")
        if len(request.conversation_ids) > d.MAX_PRUNE_CONVERSATIONS:
            raise d.InvalidArgument(
                f"at most {d.MAX_PRUNE_CONVERSATIONS} conversation_ids per call"
            )
        ids = [
            d.parse_id(cid, f"conversation_ids[{i}]")
            for i, cid in enumerate(request.conversation_ids)
        ]
        deleted = await self._checkpoints().prune_checkpoints(
            user_id=user_id, conversation_ids=ids, strategy=strategy
        )
        return pb.PruneCheckpointsResponse(checkpoints_deleted=deleted)
