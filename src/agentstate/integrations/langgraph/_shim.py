"""TEMPORARY: checkpoint calls over raw stubs until agentstate.client lands."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import grpc

from agentstate.common.service_config import channel_options
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc


class StateError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class NotFound(StateError):
    pass


class VersionConflict(StateError):
    pass


class InvalidArgument(StateError, ValueError):
    pass


class FailedPrecondition(StateError):
    pass


def _err(exc: grpc.RpcError) -> StateError:
    code = exc.code()  # type: ignore[attr-defined]
    msg = exc.details() or code.name  # type: ignore[attr-defined]
    kind = {
        grpc.StatusCode.NOT_FOUND: NotFound,
        grpc.StatusCode.ABORTED: VersionConflict,
        grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
        grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    }.get(code, StateError)
    return kind(code, msg)


class AsyncStateClient:
    def __init__(self, target: str, timeout: float = 10.0) -> None:
        self._channel = grpc.aio.insecure_channel(target, options=channel_options())
        self._stub = pb_grpc.StateServiceStub(self._channel)
        self._timeout = timeout
        self._keys: dict[tuple[str, str], str] = {}

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, name: str, request: Any) -> Any:
        try:
            return await getattr(self._stub, name)(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as exc:
            raise _err(exc) from exc

    async def resolve_conversation(self, user_id: str, key: str, create: bool = True) -> str:
        import asyncio

        self.__dict__.setdefault("_lock", asyncio.Lock())
        async with self.__dict__["_lock"]:
            return await self._resolve(user_id, key, create)

    async def _resolve(self, user_id: str, key: str, create: bool = True) -> str:
        found = self._keys.get((user_id, key))
        if found is None:
            if not create:
                raise NotFound(grpc.StatusCode.NOT_FOUND, "no such key")
            r = await self._call(
                "CreateConversation", pb.CreateConversationRequest(user_id=user_id, title=key)
            )
            found = self._keys[(user_id, key)] = r.conversation.conversation_id
        return found

    async def delete_conversation(self, user_id: str, conversation_id: str) -> None:
        await self._call(
            "DeleteConversation",
            pb.DeleteConversationRequest(user_id=user_id, conversation_id=conversation_id),
        )
        for k, v in list(self._keys.items()):
            if v == conversation_id:
                del self._keys[k]

    async def put_checkpoint(self, request: pb.PutCheckpointRequest) -> None:
        await self._call("PutCheckpoint", request)

    async def get_checkpoint(
        self, user_id: str, conversation_id: str, *, namespace: str, checkpoint_id: str = ""
    ) -> pb.Checkpoint | None:
        r = await self._call(
            "GetCheckpoint",
            pb.GetCheckpointRequest(
                user_id=user_id,
                conversation_id=conversation_id,
                namespace=namespace,
                checkpoint_id=checkpoint_id,
            ),
        )
        return r.checkpoint if r.HasField("checkpoint") else None

    async def list_checkpoints(
        self, request: pb.ListCheckpointsRequest, limit: int | None = None
    ) -> AsyncIterator[pb.Checkpoint]:
        seen = 0
        while True:
            r = await self._call("ListCheckpoints", request)
            for cp in r.checkpoints:
                yield cp
                seen += 1
                if limit is not None and seen >= limit:
                    return
            if not r.next_page_token:
                return
            request.page_token = r.next_page_token

    async def put_checkpoint_writes(self, request: pb.PutCheckpointWritesRequest) -> int:
        r = await self._call("PutCheckpointWrites", request)
        return int(r.writes_stored)

    async def delete_checkpoints_for_runs(self, user_id: str, run_ids: Sequence[str]) -> int:
        r = await self._call(
            "DeleteCheckpointsForRuns",
            pb.DeleteCheckpointsForRunsRequest(user_id=user_id, run_ids=run_ids),
        )
        return int(r.checkpoints_deleted)

    async def copy_checkpoints(self, user_id: str, source: str, target: str) -> int:
        r = await self._call(
            "CopyCheckpoints",
            pb.CopyCheckpointsRequest(
                user_id=user_id, source_conversation_id=source, target_conversation_id=target
            ),
        )
        return int(r.checkpoints_copied)

    async def prune_checkpoints(
        self, user_id: str, conversation_ids: Sequence[str], keep_latest: bool
    ) -> int:
        strategy = pb.PRUNE_STRATEGY_KEEP_LATEST if keep_latest else pb.PRUNE_STRATEGY_DELETE_ALL
        r = await self._call(
            "PruneCheckpoints",
            pb.PruneCheckpointsRequest(
                user_id=user_id, conversation_ids=conversation_ids, strategy=strategy
            ),
        )
        return int(r.checkpoints_deleted)


class StateClient:
    def __init__(self, target: str, timeout: float = 10.0) -> None:
        self._channel = grpc.insecure_channel(target, options=channel_options())
        self._stub = pb_grpc.StateServiceStub(self._channel)
        self._timeout = timeout
        self._keys: dict[tuple[str, str], str] = {}

    def close(self) -> None:
        self._channel.close()

    def _call(self, name: str, request: Any) -> Any:
        try:
            return getattr(self._stub, name)(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            raise _err(exc) from exc

    def resolve_conversation(self, user_id: str, key: str, create: bool = True) -> str:
        found = self._keys.get((user_id, key))
        if found is None:
            if not create:
                raise NotFound(grpc.StatusCode.NOT_FOUND, "no such key")
            r = self._call(
                "CreateConversation", pb.CreateConversationRequest(user_id=user_id, title=key)
            )
            found = self._keys[(user_id, key)] = r.conversation.conversation_id
        return found

    def delete_conversation(self, user_id: str, conversation_id: str) -> None:
        self._call(
            "DeleteConversation",
            pb.DeleteConversationRequest(user_id=user_id, conversation_id=conversation_id),
        )
        for k, v in list(self._keys.items()):
            if v == conversation_id:
                del self._keys[k]

    def put_checkpoint(self, request: pb.PutCheckpointRequest) -> None:
        self._call("PutCheckpoint", request)

    def get_checkpoint(
        self, user_id: str, conversation_id: str, *, namespace: str, checkpoint_id: str = ""
    ) -> pb.Checkpoint | None:
        r = self._call(
            "GetCheckpoint",
            pb.GetCheckpointRequest(
                user_id=user_id,
                conversation_id=conversation_id,
                namespace=namespace,
                checkpoint_id=checkpoint_id,
            ),
        )
        return r.checkpoint if r.HasField("checkpoint") else None

    def list_checkpoints(
        self, request: pb.ListCheckpointsRequest, limit: int | None = None
    ) -> Iterator[pb.Checkpoint]:
        seen = 0
        while True:
            r = self._call("ListCheckpoints", request)
            for cp in r.checkpoints:
                yield cp
                seen += 1
                if limit is not None and seen >= limit:
                    return
            if not r.next_page_token:
                return
            request.page_token = r.next_page_token

    def put_checkpoint_writes(self, request: pb.PutCheckpointWritesRequest) -> int:
        r = self._call("PutCheckpointWrites", request)
        return int(r.writes_stored)

    def delete_checkpoints_for_runs(self, user_id: str, run_ids: Sequence[str]) -> int:
        r = self._call(
            "DeleteCheckpointsForRuns",
            pb.DeleteCheckpointsForRunsRequest(user_id=user_id, run_ids=run_ids),
        )
        return int(r.checkpoints_deleted)

    def copy_checkpoints(self, user_id: str, source: str, target: str) -> int:
        r = self._call(
            "CopyCheckpoints",
            pb.CopyCheckpointsRequest(
                user_id=user_id, source_conversation_id=source, target_conversation_id=target
            ),
        )
        return int(r.checkpoints_copied)

    def prune_checkpoints(
        self, user_id: str, conversation_ids: Sequence[str], keep_latest: bool
    ) -> int:
        strategy = pb.PRUNE_STRATEGY_KEEP_LATEST if keep_latest else pb.PRUNE_STRATEGY_DELETE_ALL
        r = self._call(
            "PruneCheckpoints",
            pb.PruneCheckpointsRequest(
                user_id=user_id, conversation_ids=conversation_ids, strategy=strategy
            ),
        )
        return int(r.checkpoints_deleted)
