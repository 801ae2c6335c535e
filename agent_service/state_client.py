"""The state client: the only way the agent service reaches session state.

It speaks the StateService contract over gRPC and turns its statuses into the
runtime's errors (agent_service.errors), so nothing above it knows gRPC.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import grpc

from agent_service import errors
from agent_service.agent_state import AgentState
from agentstate.common.grpc_metadata import trailer
from agentstate.common.state_metrics import (
    LOAD_DURATION,
    PAYLOAD_SIZE,
    SAVE_DURATION,
    VERSION_CONFLICTS,
)
from agentstate.common.telemetry import tracer
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc

P = ParamSpec("P")
R = TypeVar("R")

_ERRORS: dict[grpc.StatusCode, type[errors.AgentError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidInput,
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: errors.Conflict,
    grpc.StatusCode.ABORTED: errors.StateVersionConflict,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.LimitReached,
    grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.Unavailable,
}


def _translated(call: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    @functools.wraps(call)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await call(*args, **kwargs)
        except grpc.aio.AioRpcError as exc:
            kind = _ERRORS.get(exc.code(), errors.InternalError)
            detail = exc.details() or exc.code().name
            if kind is errors.Unavailable:
                detail = f"state service unavailable: {detail}"
            raise kind(detail) from exc

    return wrapper


@dataclass(frozen=True)
class LoadedState:
    state: AgentState | None  # None: the conversation has no state yet
    version: int  # 0 when there is no state


class StateClient:
    def __init__(self, channel: grpc.aio.Channel, *, timeout_seconds: float = 10.0) -> None:
        self._stub = pb_grpc.StateServiceStub(channel)
        self._timeout = timeout_seconds

    # -------------------------------------------------------- conversations

    @_translated
    async def create_conversation(self, user_id: str, title: str) -> pb.Conversation:
        response = await self._stub.CreateConversation(
            pb.CreateConversationRequest(user_id=user_id, title=title), timeout=self._timeout
        )
        return response.conversation

    @_translated
    async def get_conversation(self, user_id: str, conversation_id: str) -> pb.Conversation:
        response = await self._stub.GetConversation(
            pb.GetConversationRequest(user_id=user_id, conversation_id=conversation_id),
            timeout=self._timeout,
        )
        return response.conversation

    @_translated
    async def list_conversations(
        self, user_id: str, page_size: int, page_token: str
    ) -> pb.ListConversationsResponse:
        return await self._stub.ListConversations(
            pb.ListConversationsRequest(
                user_id=user_id, page_size=page_size, page_token=page_token
            ),
            timeout=self._timeout,
        )

    @_translated
    async def rename_conversation(
        self, user_id: str, conversation_id: str, title: str
    ) -> pb.Conversation:
        response = await self._stub.RenameConversation(
            pb.RenameConversationRequest(
                user_id=user_id, conversation_id=conversation_id, title=title
            ),
            timeout=self._timeout,
        )
        return response.conversation

    @_translated
    async def delete_conversations(
        self, user_id: str, conversation_ids: Sequence[str]
    ) -> pb.BatchDeleteConversationsResponse:
        return await self._stub.BatchDeleteConversations(
            pb.BatchDeleteConversationsRequest(
                user_id=user_id, conversation_ids=list(conversation_ids)
            ),
            timeout=self._timeout,
        )

    # ---------------------------------------------------------------- state

    @_translated
    async def load(self, user_id: str, conversation_id: str) -> LoadedState:
        """The stored state and its version. Any failure raises: a turn never
        starts from a fresh state because a load failed."""
        with tracer().start_as_current_span("state.load") as span:
            span.set_attribute("agentstate.conversation_id", conversation_id)
            started = time.perf_counter()
            outcome = "error"
            try:
                try:
                    response = await self._stub.GetState(
                        pb.GetStateRequest(user_id=user_id, conversation_id=conversation_id),
                        timeout=self._timeout,
                    )
                except grpc.aio.AioRpcError as exc:
                    no_state = trailer(exc, "agentstate-missing") == "state"
                    if exc.code() == grpc.StatusCode.NOT_FOUND and no_state:
                        outcome = "not_found"
                        span.set_attribute("agentstate.state.version_read", 0)
                        return LoadedState(None, 0)
                    raise
                try:
                    state = AgentState.decode(response.payload)
                except (ValueError, KeyError, TypeError) as exc:
                    raise errors.InternalError(
                        f"stored state of conversation {conversation_id} cannot be decoded: {exc}"
                    ) from exc
                outcome = "ok"
                size = len(response.payload)
                span.set_attributes(
                    {
                        "agentstate.state.payload_bytes": size,
                        "agentstate.state.message_count": len(state.context),
                        "agentstate.state.version_read": int(response.version),
                    }
                )
                PAYLOAD_SIZE.record(size, {"side": "client", "op": "load"})
                return LoadedState(state, int(response.version))
            finally:
                span.set_attribute("agentstate.state.outcome", outcome)
                LOAD_DURATION.record(
                    time.perf_counter() - started, {"side": "client", "outcome": outcome}
                )

    @_translated
    async def save(
        self,
        user_id: str,
        conversation_id: str,
        state: AgentState,
        expected_version: int,
        message_writes: Sequence[pb.MessageWrite] = (),
        compaction_records: Sequence[pb.CompactionRecord] = (),
        *,
        payload: bytes | None = None,
    ) -> pb.UpsertStateResponse:
        """Compare-and-set save of the whole state plus message records, atomically.

        `payload`: the state already encoded, when the caller has it (saves encoding twice).
        """
        payload = state.encode() if payload is None else payload
        with tracer().start_as_current_span("state.save") as span:
            span.set_attributes(
                {
                    "agentstate.conversation_id": conversation_id,
                    "agentstate.state.payload_bytes": len(payload),
                    "agentstate.state.message_count": len(state.context),
                    "agentstate.state.version_read": expected_version,
                    "agentstate.state.message_writes": len(message_writes),
                }
            )
            PAYLOAD_SIZE.record(len(payload), {"side": "client", "op": "save"})
            started = time.perf_counter()
            outcome = "error"
            try:
                response: pb.UpsertStateResponse = await self._stub.UpsertState(
                    pb.UpsertStateRequest(
                        user_id=user_id,
                        conversation_id=conversation_id,
                        payload=payload,
                        expected_version=expected_version,
                        message_writes=list(message_writes),
                        compaction_records=list(compaction_records),
                    ),
                    timeout=self._timeout,
                )
                outcome = "ok"
                span.set_attribute("agentstate.state.version_written", int(response.version))
                return response
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.ABORTED:
                    outcome = "version_conflict"
                    VERSION_CONFLICTS.add(1, {"side": "client"})
                raise
            finally:
                span.set_attribute("agentstate.state.outcome", outcome)
                SAVE_DURATION.record(
                    time.perf_counter() - started, {"side": "client", "outcome": outcome}
                )

    # ------------------------------------------------------------- messages

    @_translated
    async def append_message(
        self, user_id: str, conversation_id: str, message: pb.NewMessage
    ) -> pb.MessageRecord:
        response = await self._stub.AppendMessage(
            pb.AppendMessageRequest(
                user_id=user_id, conversation_id=conversation_id, message=message
            ),
            timeout=self._timeout,
        )
        return response.message

    @_translated
    async def update_message(
        self, user_id: str, conversation_id: str, update: pb.MessageUpdate
    ) -> pb.MessageRecord:
        response = await self._stub.UpdateMessage(
            pb.UpdateMessageRequest(
                user_id=user_id, conversation_id=conversation_id, update=update
            ),
            timeout=self._timeout,
        )
        return response.message

    @_translated
    async def get_message(
        self, user_id: str, conversation_id: str, message_id: str
    ) -> pb.MessageRecord:
        response = await self._stub.GetMessage(
            pb.GetMessageRequest(
                user_id=user_id, conversation_id=conversation_id, message_id=message_id
            ),
            timeout=self._timeout,
        )
        return response.message

    @_translated
    async def list_messages(
        self,
        user_id: str,
        conversation_id: str,
        page_size: int,
        page_token: str,
        newest_first: bool = False,
    ) -> pb.ListMessagesResponse:
        return await self._stub.ListMessages(
            pb.ListMessagesRequest(
                user_id=user_id,
                conversation_id=conversation_id,
                page_size=page_size,
                page_token=page_token,
                newest_first=newest_first,
            ),
            timeout=self._timeout,
        )

    # --------------------------------------------------------------- leases

    @_translated
    async def acquire_lease(
        self, user_id: str, conversation_id: str, holder: str, ttl_ms: int, max_user_leases: int
    ) -> pb.AcquireLeaseResponse:
        """The lease, and `lapsed_task_id` when it replaced a turn that never finished."""
        return await self._stub.AcquireLease(
            pb.AcquireLeaseRequest(
                user_id=user_id,
                conversation_id=conversation_id,
                holder=holder,
                ttl_ms=ttl_ms,
                max_user_leases=max_user_leases,
            ),
            timeout=self._timeout,
        )

    @_translated
    async def renew_lease(self, user_id: str, task_id: str, ttl_ms: int) -> pb.Lease:
        response = await self._stub.RenewLease(
            pb.RenewLeaseRequest(user_id=user_id, task_id=task_id, ttl_ms=ttl_ms),
            timeout=self._timeout,
        )
        return response.lease

    @_translated
    async def release_lease(self, user_id: str, task_id: str) -> bool:
        response = await self._stub.ReleaseLease(
            pb.ReleaseLeaseRequest(user_id=user_id, task_id=task_id), timeout=self._timeout
        )
        return bool(response.released)

    @_translated
    async def request_stop(self, user_id: str, task_id: str) -> pb.Lease:
        response = await self._stub.RequestStop(
            pb.RequestStopRequest(user_id=user_id, task_id=task_id), timeout=self._timeout
        )
        return response.lease

    @_translated
    async def list_compactions(
        self, user_id: str, conversation_id: str
    ) -> list[pb.CompactionRecord]:
        response = await self._stub.ListCompactions(
            pb.ListCompactionsRequest(user_id=user_id, conversation_id=conversation_id),
            timeout=self._timeout,
        )
        return list(response.compactions)
