"""The state client: the only way the agent service reaches session state, and the
one place that speaks the StateService contract.

It turns the runtime's types (agent_service.records) into protobuf and back, and the
state service's statuses into the runtime's errors (agent_service.errors), so
nothing above it knows gRPC or protobuf.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar

import grpc
import orjson
from google.protobuf.timestamp_pb2 import Timestamp

from agentstate.agent_service import errors
from agentstate.agent_service.agent_state import AgentState
from agentstate.agent_service.records import (
    BegunTurn,
    CompactionNote,
    Conversation,
    Deleted,
    EndedTurn,
    LeaseInfo,
    LoadedState,
    MessageRecord,
    NewRecord,
    NoOpenCard,
    OpenCard,
    Page,
    RecordRole,
    RecordStatus,
    RecordUpdate,
    RecordWrite,
    StateChange,
    TurnRequest,
)
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


def _translated(call: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    @functools.wraps(call)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await call(*args, **kwargs)
        except grpc.aio.AioRpcError as exc:
            kind = _ERRORS.get(exc.code(), errors.InternalError)
            detail = exc.details() or exc.code().name
            if kind is errors.Unavailable:
                detail = f"state service unavailable: {detail}"
            awaiting = trailer(exc, "agentstate-awaiting-message")
            if kind is errors.Conflict and awaiting:
                raise errors.CardPending(detail, awaiting) from exc
            raise kind(detail) from exc

    return wrapper


_ROLES = {
    RecordRole.USER: pb.MESSAGE_ROLE_USER,
    RecordRole.ASSISTANT: pb.MESSAGE_ROLE_ASSISTANT,
}
_STATUSES = {
    RecordStatus.NORMAL: pb.MESSAGE_STATUS_NORMAL,
    RecordStatus.AWAITING_CONFIRM: pb.MESSAGE_STATUS_AWAITING_CONFIRM,
    RecordStatus.INTERRUPTED: pb.MESSAGE_STATUS_INTERRUPTED,
    RecordStatus.ERROR: pb.MESSAGE_STATUS_ERROR,
    RecordStatus.STREAMING: pb.MESSAGE_STATUS_STREAMING,
}


def _json(value: Any) -> bytes:
    return orjson.dumps(value)


def _status(status: RecordStatus | None) -> pb.MessageStatus.ValueType:
    return pb.MESSAGE_STATUS_UNSPECIFIED if status is None else _STATUSES[status]


def new_message_pb(record: NewRecord) -> pb.NewMessage:
    return pb.NewMessage(
        role=_ROLES[record.role],
        blocks_json=_json(record.blocks),
        status=_STATUSES[record.status],
        metadata_json=_json(record.metadata),
    )


def message_update_pb(update: RecordUpdate) -> pb.MessageUpdate:
    message = pb.MessageUpdate(
        message_id=update.message_id,
        status=_status(update.status),
        expected_status=_status(update.expected_status),
    )
    if update.blocks is not None:
        message.blocks_json = _json(update.blocks)
    if update.metadata is not None:
        message.metadata_json = _json(update.metadata)
    return message


def message_write_pb(write: RecordWrite) -> pb.MessageWrite:
    if isinstance(write, NewRecord):
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


def state_delta_pb(change: StateChange) -> pb.StateDelta:
    delta = pb.StateDelta(
        base_version=change.base_version, drop_head=change.drop_head, messages=change.messages
    )
    if change.replace_from is not None:
        delta.replace_from = change.replace_from
    if change.fields_json is not None:
        delta.fields_json = change.fields_json
    return delta


def _decode_state(payload: bytes, conversation_id: str) -> AgentState:
    try:
        return AgentState.decode(payload)
    except (ValueError, KeyError, TypeError) as exc:
        raise errors.InternalError(
            f"stored state of conversation {conversation_id} cannot be decoded: {exc}"
        ) from exc


def _time(value: Timestamp) -> datetime:
    return value.ToDatetime(tzinfo=UTC)


def conversation_of(message: pb.Conversation) -> Conversation:
    return Conversation(
        conversation_id=message.conversation_id,
        title=message.title,
        create_time=_time(message.create_time),
        update_time=_time(message.update_time),
    )


_ROLE_OF = {v: k for k, v in _ROLES.items()}
_STATUS_OF = {v: k for k, v in _STATUSES.items()}


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
    )


class StateClient:
    """The agent's StatePort over gRPC (see agent_service/runtime/port.py), plus the
    conversation and record reads the agent's own API passes through."""

    def __init__(self, channel: grpc.aio.Channel, *, timeout_seconds: float = 10.0) -> None:
        self._stub = pb_grpc.StateServiceStub(channel)
        self._timeout = timeout_seconds

    # -------------------------------------------------------- conversations

    @_translated
    async def list_conversations(
        self, user_id: str, page_size: int, page_token: str
    ) -> Page[Conversation]:
        response = await self._stub.ListConversations(
            pb.ListConversationsRequest(
                user_id=user_id, page_size=page_size, page_token=page_token
            ),
            timeout=self._timeout,
        )
        return Page([conversation_of(c) for c in response.conversations], response.next_page_token)

    @_translated
    async def rename_conversation(
        self, user_id: str, conversation_id: str, title: str
    ) -> Conversation:
        response = await self._stub.RenameConversation(
            pb.RenameConversationRequest(
                user_id=user_id, conversation_id=conversation_id, title=title
            ),
            timeout=self._timeout,
        )
        return conversation_of(response.conversation)

    @_translated
    async def delete_conversations(self, user_id: str, conversation_ids: Sequence[str]) -> Deleted:
        response = await self._stub.BatchDeleteConversations(
            pb.BatchDeleteConversationsRequest(
                user_id=user_id, conversation_ids=list(conversation_ids)
            ),
            timeout=self._timeout,
        )
        return Deleted(
            conversations=int(response.conversations_deleted),
            messages=int(response.messages_deleted),
            states=int(response.states_deleted),
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
                state = _decode_state(response.payload, conversation_id)
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

    # ---------------------------------------------------------------- turns

    @_translated
    async def begin_turn(self, request: TurnRequest) -> BegunTurn:
        """Start a turn in one call: (create the conversation,) take the lease, check the
        card guard, append the turn's records, load the state. Any failure raises and
        changes nothing: a turn never starts from a fresh state because a load failed."""
        guard = request.guard
        message = pb.BeginTurnRequest(
            user_id=request.user_id,
            conversation_id=request.conversation_id,
            title=request.title,
            holder=request.holder,
            ttl_ms=request.ttl_ms,
            max_user_leases=request.max_user_leases,
            new_messages=[new_message_pb(r) for r in request.new_records],
        )
        if request.cached_version is not None:
            message.cached_version = request.cached_version
        if isinstance(guard, NoOpenCard):
            message.require_none_awaiting = True
        elif isinstance(guard, OpenCard):
            message.require_awaiting_message_id = guard.message_id
        with tracer().start_as_current_span("state.load") as span:
            span.set_attribute("agentstate.state.rpc", "BeginTurn")
            if request.conversation_id:
                span.set_attribute("agentstate.conversation_id", request.conversation_id)
            started = time.perf_counter()
            outcome = "error"
            try:
                response: pb.BeginTurnResponse = await self._stub.BeginTurn(
                    message, timeout=self._timeout
                )
                conversation_id = response.conversation.conversation_id
                state = None
                if response.version and not response.payload_omitted:
                    state = _decode_state(response.payload, conversation_id)
                    size = len(response.payload)
                    span.set_attributes(
                        {
                            "agentstate.state.payload_bytes": size,
                            "agentstate.state.message_count": len(state.context),
                        }
                    )
                    PAYLOAD_SIZE.record(size, {"side": "client", "op": "load"})
                if response.payload_omitted:  # the caller holds this version already
                    span.set_attributes(
                        {
                            "agentstate.state.payload_omitted": True,
                            "agentstate.state.payload_bytes": 0,
                        }
                    )
                outcome = "ok" if response.version else "not_found"
                span.set_attributes(
                    {
                        "agentstate.conversation_id": conversation_id,
                        "agentstate.state.version_read": int(response.version),
                    }
                )
                return BegunTurn(
                    conversation_id=conversation_id,
                    conversation_created=response.conversation_created,
                    task_id=response.lease.task_id,
                    lapsed_task_id=response.lapsed_task_id,
                    interrupted_records=response.interrupted_records,
                    state=state,
                    version=int(response.version),
                    record_ids=[m.message_id for m in response.messages],
                    payload_omitted=response.payload_omitted,
                )
            finally:
                span.set_attribute("agentstate.state.outcome", outcome)
                LOAD_DURATION.record(
                    time.perf_counter() - started, {"side": "client", "outcome": outcome}
                )

    @_translated
    async def end_turn(
        self,
        user_id: str,
        conversation_id: str,
        task_id: str,
        *,
        payload: bytes | None,
        message_count: int,
        expected_version: int,
        writes: Sequence[RecordWrite] = (),
        compactions: Sequence[CompactionNote] = (),
        change: StateChange | None = None,
    ) -> EndedTurn:
        """Save the turn in one call: the whole state (compare-and-set on the loaded
        version) or what changed since that version (`change`), its record writes and
        compaction notes, and release the lease. On any error nothing is saved and the
        lease is kept."""
        sent = len(payload or b"") if change is None else change.size
        with tracer().start_as_current_span("state.save") as span:
            span.set_attributes(
                {
                    "agentstate.state.rpc": "EndTurn",
                    "agentstate.conversation_id": conversation_id,
                    "agentstate.state.payload_bytes": sent,
                    "agentstate.state.delta": change is not None,
                    "agentstate.state.message_count": message_count,
                    "agentstate.state.version_read": expected_version,
                    "agentstate.state.message_writes": len(writes),
                }
            )
            PAYLOAD_SIZE.record(sent, {"side": "client", "op": "save"})
            request = pb.EndTurnRequest(
                user_id=user_id,
                conversation_id=conversation_id,
                task_id=task_id,
                message_writes=[message_write_pb(w) for w in writes],
                compaction_records=[compaction_pb(c) for c in compactions],
            )
            if change is None:
                request.payload = payload or b""
                request.expected_version = expected_version
            else:
                request.delta.CopyFrom(state_delta_pb(change))
            started = time.perf_counter()
            outcome = "error"
            try:
                response: pb.EndTurnResponse = await self._stub.EndTurn(
                    request, timeout=self._timeout
                )
                outcome = "ok"
                span.set_attribute("agentstate.state.version_written", int(response.version))
                return EndedTurn(int(response.version), response.lease_released)
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
    async def update_message(
        self, user_id: str, conversation_id: str, update: RecordUpdate
    ) -> None:
        await self._stub.UpdateMessage(
            pb.UpdateMessageRequest(
                user_id=user_id, conversation_id=conversation_id, update=message_update_pb(update)
            ),
            timeout=self._timeout,
        )

    @_translated
    async def list_messages(
        self,
        user_id: str,
        conversation_id: str,
        page_size: int,
        page_token: str,
        newest_first: bool = False,
    ) -> Page[MessageRecord]:
        response = await self._stub.ListMessages(
            pb.ListMessagesRequest(
                user_id=user_id,
                conversation_id=conversation_id,
                page_size=page_size,
                page_token=page_token,
                newest_first=newest_first,
            ),
            timeout=self._timeout,
        )
        return Page([record_of(m) for m in response.messages], response.next_page_token)

    # --------------------------------------------------------------- leases

    @_translated
    async def renew_lease(self, user_id: str, task_id: str, ttl_ms: int) -> LeaseInfo:
        response = await self._stub.RenewLease(
            pb.RenewLeaseRequest(user_id=user_id, task_id=task_id, ttl_ms=ttl_ms),
            timeout=self._timeout,
        )
        return lease_of(response.lease)

    @_translated
    async def release_lease(self, user_id: str, task_id: str) -> bool:
        response = await self._stub.ReleaseLease(
            pb.ReleaseLeaseRequest(user_id=user_id, task_id=task_id), timeout=self._timeout
        )
        return bool(response.released)

    @_translated
    async def request_stop(self, user_id: str, task_id: str) -> LeaseInfo:
        response = await self._stub.RequestStop(
            pb.RequestStopRequest(user_id=user_id, task_id=task_id), timeout=self._timeout
        )
        return lease_of(response.lease)
