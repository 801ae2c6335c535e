"""StateService servicer: translates between protobuf and the domain, nothing more."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from opentelemetry.metrics import Histogram

from agentstate.common import error_details
from agentstate.common.state_metrics import (
    LOAD_DURATION,
    PAYLOAD_SIZE,
    SAVE_DURATION,
    VERSION_CONFLICTS,
)
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service import domain as d
from agentstate.state_service.error_reasons import state_error_detail
from agentstate.state_service.storage.base import StateStore

log = logging.getLogger(__name__)

CURRENT_VERSION_TRAILER = "agentstate-current-version"
MISSING_TRAILER = "agentstate-missing"
AWAITING_MESSAGE_TRAILER = "agentstate-awaiting-message"

_STATUS_CODES: dict[type, grpc.StatusCode] = {
    d.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    d.NotFound: grpc.StatusCode.NOT_FOUND,
    d.VersionConflict: grpc.StatusCode.ABORTED,
    d.CheckpointConflict: grpc.StatusCode.ABORTED,
    d.PayloadTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    d.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    d.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    d.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    d.StoreUnavailable: grpc.StatusCode.UNAVAILABLE,
    d.StoreError: grpc.StatusCode.INTERNAL,
}

_ROLE_TO_DOMAIN = {
    pb.MESSAGE_ROLE_USER: d.MessageRole.USER,
    pb.MESSAGE_ROLE_ASSISTANT: d.MessageRole.ASSISTANT,
}
_ROLE_TO_PB = {v: k for k, v in _ROLE_TO_DOMAIN.items()}
_STATUS_TO_DOMAIN = {
    pb.MESSAGE_STATUS_NORMAL: d.MessageStatus.NORMAL,
    pb.MESSAGE_STATUS_AWAITING_CONFIRM: d.MessageStatus.AWAITING_CONFIRM,
    pb.MESSAGE_STATUS_INTERRUPTED: d.MessageStatus.INTERRUPTED,
    pb.MESSAGE_STATUS_ERROR: d.MessageStatus.ERROR,
    pb.MESSAGE_STATUS_STREAMING: d.MessageStatus.STREAMING,
}
_STATUS_TO_PB = {v: k for k, v in _STATUS_TO_DOMAIN.items()}

Request = TypeVar("Request")
Response = TypeVar("Response")
Handler = Callable[[Any, Request, grpc.aio.ServicerContext[Any, Any]], Awaitable[Response]]


class _Throttle:
    """At most one log line per `interval` seconds, counting the ones left out."""

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._next = 0.0
        self._skipped = 0

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            self._skipped += 1
            return False
        self._next = now + self._interval
        return True

    def take_skipped(self) -> int:
        skipped, self._skipped = self._skipped, 0
        return skipped


# During an outage calls fail fast, possibly thousands a second; the outage itself is
# logged once by the pool's watcher (agentstate/common/pg_pool.py).
_UNAVAILABLE_LOG = _Throttle(5.0)


def _grpc_errors(handler: Handler[Request, Response]) -> Handler[Request, Response]:
    """Turn domain errors into gRPC statuses with the domain's message, their trailers
    and a google.rpc.ErrorInfo detail (agentstate.common.error_details)."""

    @functools.wraps(handler)
    async def wrapper(
        self: Any, request: Request, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Response:
        try:
            return await handler(self, request, context)
        except d.StateServiceError as exc:
            trailers: tuple[tuple[str, str], ...] = ()
            if isinstance(exc, d.VersionConflict):
                trailers = ((CURRENT_VERSION_TRAILER, str(exc.current_version)),)
            elif isinstance(exc, d.NotFound):
                trailers = ((MISSING_TRAILER, exc.missing),)
            elif isinstance(exc, d.CardPending):
                trailers = ((AWAITING_MESSAGE_TRAILER, str(exc.message_id)),)
            code = status_code(exc)
            if code is grpc.StatusCode.UNAVAILABLE and _UNAVAILABLE_LOG.due():
                log.warning(
                    "%s: %s (%d more UNAVAILABLE since the last one logged)",
                    handler.__name__,
                    exc,
                    _UNAVAILABLE_LOG.take_skipped(),
                )
            # The trailers stay for existing clients; the ErrorInfo detail says the same.
            detail = state_error_detail(exc, handler.__name__)
            await error_details.abort(context, code, str(exc), detail, trailers)

    return wrapper


def status_code(exc: d.StateServiceError) -> grpc.StatusCode:
    """The status of an error: that of its nearest class in the table (a subclass
    such as LeaseHeld answers as FailedPrecondition does)."""
    for kind in type(exc).__mro__:
        code = _STATUS_CODES.get(kind)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


@contextlib.contextmanager
def _timed(histogram: Histogram) -> Iterator[None]:
    """Record a store call's latency by outcome; count version conflicts."""
    started = time.perf_counter()
    outcome = "error"
    try:
        yield
        outcome = "ok"
    except d.NotFound:
        outcome = "not_found"
        raise
    except d.VersionConflict:
        outcome = "version_conflict"
        VERSION_CONFLICTS.add(1, {"side": "server"})
        raise
    finally:
        histogram.record(time.perf_counter() - started, {"side": "server", "outcome": outcome})


def _timestamp(value: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def conversation_to_pb(conversation: d.Conversation) -> pb.Conversation:
    return pb.Conversation(
        conversation_id=str(conversation.conversation_id),
        user_id=conversation.user_id,
        title=conversation.title,
        create_time=_timestamp(conversation.create_time),
        update_time=_timestamp(conversation.update_time),
        external_key=conversation.external_key,
    )


def message_to_pb(record: d.MessageRecord) -> pb.MessageRecord:
    return pb.MessageRecord(
        message_id=str(record.message_id),
        conversation_id=str(record.conversation_id),
        user_id=record.user_id,
        role=_ROLE_TO_PB[record.role],
        blocks_json=record.blocks_json,
        status=_STATUS_TO_PB[record.status],
        metadata_json=record.metadata_json,
        create_time=_timestamp(record.create_time),
        update_time=_timestamp(record.update_time),
    )


def lease_to_pb(lease: d.Lease) -> pb.Lease:
    return pb.Lease(
        task_id=str(lease.task_id),
        conversation_id=str(lease.conversation_id),
        user_id=lease.user_id,
        holder=lease.holder,
        expire_time=_timestamp(lease.expire_time),
        stop_requested=lease.stop_requested,
        acquire_time=_timestamp(lease.acquire_time) if lease.acquire_time else None,
    )


def compaction_to_pb(compaction: d.Compaction) -> pb.CompactionRecord:
    record = pb.CompactionRecord(
        compaction_id=str(compaction.compaction_id),
        messages_before=compaction.messages_before,
        messages_after=compaction.messages_after,
        tokens_before=compaction.tokens_before,
        tokens_after=compaction.tokens_after,
        summary_chars=compaction.summary_chars,
        reason=compaction.reason,
    )
    if compaction.create_time is not None:
        record.create_time.CopyFrom(_timestamp(compaction.create_time))
    return record


def compaction_from_pb(record: pb.CompactionRecord, index: int) -> d.Compaction:
    numbers = (
        record.messages_before,
        record.messages_after,
        record.tokens_before,
        record.tokens_after,
        record.summary_chars,
    )
    if min(numbers) < 0:
        raise d.InvalidArgument(f"compaction_records[{index}] has a negative count")
    if len(record.reason) > 500:
        raise d.InvalidArgument(f"compaction_records[{index}].reason is over 500 characters")
    d.check_no_nul(record.reason, f"compaction_records[{index}].reason")
    return d.Compaction(*numbers, reason=record.reason)


def _status(value: pb.MessageStatus.ValueType, what: str) -> d.MessageStatus | None:
    if value == pb.MESSAGE_STATUS_UNSPECIFIED:
        return None
    try:
        return _STATUS_TO_DOMAIN[value]
    except KeyError:
        raise d.InvalidArgument(f"{what} {value} is not a known MessageStatus") from None


def new_message_from_pb(message: pb.NewMessage, what: str) -> d.NewMessage:
    role = _ROLE_TO_DOMAIN.get(message.role)
    if role is None:
        raise d.InvalidArgument(f"{what}.role must be MESSAGE_ROLE_USER or MESSAGE_ROLE_ASSISTANT")
    return d.NewMessage(
        role=role,
        blocks_json=d.check_blocks_json(message.blocks_json, f"{what}.blocks_json"),
        status=_status(message.status, f"{what}.status") or d.MessageStatus.NORMAL,
        metadata_json=d.check_metadata_json(message.metadata_json, f"{what}.metadata_json"),
    )


def message_update_from_pb(update: pb.MessageUpdate, what: str) -> d.MessageUpdate:
    return d.MessageUpdate(
        message_id=d.parse_id(update.message_id, f"{what}.message_id"),
        status=_status(update.status, f"{what}.status"),
        blocks_json=(
            d.check_blocks_json(update.blocks_json, f"{what}.blocks_json")
            if update.HasField("blocks_json")
            else None
        ),
        metadata_json=(
            d.check_metadata_json(update.metadata_json, f"{what}.metadata_json")
            if update.HasField("metadata_json")
            else None
        ),
        expected_status=_status(update.expected_status, f"{what}.expected_status"),
    )


def message_write_from_pb(write: pb.MessageWrite, index: int) -> d.MessageWrite:
    what = f"message_writes[{index}]"
    kind = write.WhichOneof("write")
    if kind == "insert":
        return new_message_from_pb(write.insert, f"{what}.insert")
    if kind == "update":
        return message_update_from_pb(write.update, f"{what}.update")
    raise d.InvalidArgument(f"{what} must set insert or update")


@dataclass(frozen=True)
class _Save:
    """A validated UpsertState / EndTurn request."""

    user_id: str
    conversation_id: int
    state_key: str
    payload: bytes | None
    expected_version: int | None
    writes: list[d.MessageWrite]
    compactions: list[d.Compaction]
    delta: d.StateDelta | None
    max_state_bytes: int

    def arguments(self) -> dict[str, Any]:
        """The store's save_state keywords."""
        return {
            "user_id": self.user_id,
            "conversation_id": self.conversation_id,
            "state_key": self.state_key,
            "payload": self.payload,
            "expected_version": self.expected_version,
            "message_writes": self.writes,
            "compactions": self.compactions,
            "delta": self.delta,
            "max_state_bytes": self.max_state_bytes,
        }


def delta_from_pb(delta: pb.StateDelta) -> d.StateDelta:
    return d.StateDelta(
        base_version=delta.base_version,
        drop_head=delta.drop_head,
        replace_from=delta.replace_from if delta.HasField("replace_from") else None,
        messages=tuple(delta.messages),
        fields_json=delta.fields_json if delta.HasField("fields_json") else None,
    )


# ------------------------------------------------------ checkpoints (issue 15)

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
        create_time=_timestamp(cp.create_time),
    )


class StateServicer(pb_grpc.StateServiceServicer):
    def __init__(self, store: StateStore, *, max_payload_bytes: int) -> None:
        self._store = store
        self._max_payload_bytes = max_payload_bytes

    @_grpc_errors
    async def GetState(
        self, request: pb.GetStateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetStateResponse:
        with _timed(LOAD_DURATION):
            state = await self._store.get_state(
                user_id=d.validate_user_id(request.user_id),
                conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
                state_key=d.validate_state_key(request.state_key),
            )
        PAYLOAD_SIZE.record(len(state.payload), {"side": "server", "op": "load"})
        return pb.GetStateResponse(
            payload=state.payload, version=state.version, update_time=_timestamp(state.update_time)
        )

    def _save_request(self, request: pb.UpsertStateRequest | pb.EndTurnRequest) -> _Save:
        expected: int | None = None
        if request.HasField("expected_version"):
            expected = request.expected_version
            if expected < 0:
                raise d.InvalidArgument("expected_version must not be negative")
        delta: d.StateDelta | None = None
        payload: bytes | None = request.payload
        if request.HasField("delta"):
            if request.payload:
                raise d.InvalidArgument("send either payload or delta, not both")
            if expected is not None:
                raise d.InvalidArgument(
                    "expected_version must be absent with a delta (delta.base_version is its "
                    "compare-and-set)"
                )
            delta = delta_from_pb(request.delta)
            d.check_state_delta(delta)
            payload = None
        else:
            d.check_state_payload(request.payload, self._max_payload_bytes)
        save = _Save(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
            state_key=d.validate_state_key(request.state_key),
            payload=payload,
            expected_version=expected,
            writes=[message_write_from_pb(w, i) for i, w in enumerate(request.message_writes)],
            compactions=[
                compaction_from_pb(c, i) for i, c in enumerate(request.compaction_records)
            ],
            delta=delta,
            max_state_bytes=self._max_payload_bytes,
        )
        sent = len(request.payload) if delta is None else request.delta.ByteSize()
        PAYLOAD_SIZE.record(sent, {"side": "server", "op": "save"})
        return save

    @_grpc_errors
    async def UpsertState(
        self, request: pb.UpsertStateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.UpsertStateResponse:
        save = self._save_request(request)
        with _timed(SAVE_DURATION):
            result = await self._store.save_state(**save.arguments())
        return pb.UpsertStateResponse(
            version=result.version,
            update_time=_timestamp(result.update_time),
            messages=[message_to_pb(m) for m in result.messages],
        )

    @_grpc_errors
    async def BeginTurn(
        self, request: pb.BeginTurnRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.BeginTurnResponse:
        if request.max_user_leases < 0:
            raise d.InvalidArgument("max_user_leases must not be negative")
        guard: d.CardGuard | None = None
        which = request.WhichOneof("awaiting_confirm_guard")
        if which == "require_none_awaiting" and request.require_none_awaiting:
            guard = d.RequireNoneAwaiting()
        elif which == "require_awaiting_message_id":
            guard = d.RequireAwaiting(
                d.parse_id(request.require_awaiting_message_id, "require_awaiting_message_id")
            )
        user_id = d.validate_user_id(request.user_id)
        conversation_id = (
            d.parse_id(request.conversation_id, "conversation_id")
            if request.conversation_id
            else None
        )
        start = d.TurnStart(
            holder=d.validate_holder(request.holder),
            ttl_ms=d.validate_ttl_ms(request.ttl_ms),
            max_user_leases=request.max_user_leases,
            title=d.normalize_title(request.title, default=d.DEFAULT_TITLE),
            state_key=d.validate_state_key(request.state_key),
            cached_version=(request.cached_version if request.HasField("cached_version") else None),
            new_messages=tuple(
                new_message_from_pb(m, f"new_messages[{i}]")
                for i, m in enumerate(request.new_messages)
            ),
            guard=guard,
        )
        with _timed(LOAD_DURATION):
            begun = await self._store.begin_turn(
                user_id=user_id, conversation_id=conversation_id, start=start
            )
        response = pb.BeginTurnResponse(
            conversation=conversation_to_pb(begun.conversation),
            conversation_created=begun.conversation_created,
            lease=lease_to_pb(begun.lease),
            lapsed_task_id=str(begun.lapsed_task_id) if begun.lapsed_task_id else "",
            interrupted_records=begun.interrupted_records,
            messages=[message_to_pb(m) for m in begun.messages],
        )
        if begun.state is not None:
            response.payload_omitted = begun.payload_omitted
            response.payload = begun.state.payload
            response.version = begun.state.version
            response.state_update_time.CopyFrom(_timestamp(begun.state.update_time))
            PAYLOAD_SIZE.record(len(begun.state.payload), {"side": "server", "op": "load"})
        return response

    @_grpc_errors
    async def EndTurn(
        self, request: pb.EndTurnRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.EndTurnResponse:
        save = self._save_request(request)
        task_id = d.parse_id(request.task_id, "task_id")
        with _timed(SAVE_DURATION):
            result = await self._store.save_state(**save.arguments(), task_id=task_id)
        return pb.EndTurnResponse(
            version=result.version,
            update_time=_timestamp(result.update_time),
            messages=[message_to_pb(m) for m in result.messages],
            lease_released=result.lease_released,
        )

    @_grpc_errors
    async def CreateConversation(
        self, request: pb.CreateConversationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CreateConversationResponse:
        conversation = await self._store.create_conversation(
            user_id=d.validate_user_id(request.user_id),
            title=d.normalize_title(request.title, default=d.DEFAULT_TITLE),
            external_key=(
                d.validate_external_key(request.external_key) if request.external_key else ""
            ),
        )
        return pb.CreateConversationResponse(conversation=conversation_to_pb(conversation))

    @_grpc_errors
    async def ResolveConversation(
        self, request: pb.ResolveConversationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ResolveConversationResponse:
        resolved = await self._store.resolve_conversation(
            user_id=d.validate_user_id(request.user_id),
            external_key=d.validate_external_key(request.external_key),
            create_if_missing=request.create_if_missing,
            title=d.normalize_title(request.title, default=d.DEFAULT_TITLE),
        )
        return pb.ResolveConversationResponse(
            conversation=conversation_to_pb(resolved.conversation), created=resolved.created
        )

    @_grpc_errors
    async def GetConversation(
        self, request: pb.GetConversationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetConversationResponse:
        conversation = await self._store.get_conversation(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
        )
        return pb.GetConversationResponse(conversation=conversation_to_pb(conversation))

    @_grpc_errors
    async def ListConversations(
        self, request: pb.ListConversationsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListConversationsResponse:
        page = await self._store.list_conversations(
            user_id=d.validate_user_id(request.user_id),
            page_size=d.page_size(request.page_size, default=50, maximum=500),
            before_id=d.parse_page_token(request.page_token),
        )
        return pb.ListConversationsResponse(
            conversations=[conversation_to_pb(c) for c in page.items],
            next_page_token=page.next_page_token,
        )

    @_grpc_errors
    async def RenameConversation(
        self, request: pb.RenameConversationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RenameConversationResponse:
        conversation = await self._store.rename_conversation(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
            title=d.normalize_title(request.title),
        )
        return pb.RenameConversationResponse(conversation=conversation_to_pb(conversation))

    @_grpc_errors
    async def DeleteConversation(
        self, request: pb.DeleteConversationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DeleteConversationResponse:
        counts = await self._store.delete_conversations(
            user_id=d.validate_user_id(request.user_id),
            conversation_ids=[d.parse_id(request.conversation_id, "conversation_id")],
        )
        return pb.DeleteConversationResponse(
            conversations_deleted=counts.conversations,
            messages_deleted=counts.messages,
            states_deleted=counts.states,
        )

    @_grpc_errors
    async def BatchDeleteConversations(
        self,
        request: pb.BatchDeleteConversationsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.BatchDeleteConversationsResponse:
        user_id = d.validate_user_id(request.user_id)
        if not request.conversation_ids:
            raise d.InvalidArgument("conversation_ids must not be empty")
        if len(request.conversation_ids) > d.MAX_BATCH_DELETE:
            raise d.InvalidArgument(f"at most {d.MAX_BATCH_DELETE} conversation_ids per batch")
        ids = [
            d.parse_id(cid, f"conversation_ids[{i}]")
            for i, cid in enumerate(request.conversation_ids)
        ]
        counts = await self._store.delete_conversations(user_id=user_id, conversation_ids=ids)
        return pb.BatchDeleteConversationsResponse(
            conversations_deleted=counts.conversations,
            messages_deleted=counts.messages,
            states_deleted=counts.states,
        )

    @_grpc_errors
    async def AppendMessage(
        self, request: pb.AppendMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.AppendMessageResponse:
        if not request.HasField("message"):
            raise d.InvalidArgument("message is required")
        record = await self._store.append_message(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
            message=new_message_from_pb(request.message, "message"),
        )
        return pb.AppendMessageResponse(message=message_to_pb(record))

    @_grpc_errors
    async def UpdateMessage(
        self, request: pb.UpdateMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.UpdateMessageResponse:
        if not request.HasField("update"):
            raise d.InvalidArgument("update is required")
        record = await self._store.update_message(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
            update=message_update_from_pb(request.update, "update"),
        )
        return pb.UpdateMessageResponse(message=message_to_pb(record))

    @_grpc_errors
    async def ListMessages(
        self, request: pb.ListMessagesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListMessagesResponse:
        page = await self._store.list_messages(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
            page_size=d.page_size(request.page_size, default=100, maximum=1000),
            after_id=d.parse_page_token(request.page_token),
            newest_first=request.newest_first,
        )
        return pb.ListMessagesResponse(
            messages=[message_to_pb(m) for m in page.items],
            next_page_token=page.next_page_token,
        )

    @_grpc_errors
    async def GetMessage(
        self, request: pb.GetMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetMessageResponse:
        record = await self._store.get_message(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
            message_id=d.parse_id(request.message_id, "message_id"),
        )
        return pb.GetMessageResponse(message=message_to_pb(record))

    @_grpc_errors
    async def AcquireLease(
        self, request: pb.AcquireLeaseRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.AcquireLeaseResponse:
        if request.max_user_leases < 0:
            raise d.InvalidArgument("max_user_leases must not be negative")
        acquired = await self._store.acquire_lease(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
            holder=d.validate_holder(request.holder),
            ttl_ms=d.validate_ttl_ms(request.ttl_ms),
            max_user_leases=request.max_user_leases,
        )
        lapsed = acquired.lapsed_task_id
        return pb.AcquireLeaseResponse(
            lease=lease_to_pb(acquired.lease), lapsed_task_id=str(lapsed) if lapsed else ""
        )

    @_grpc_errors
    async def RenewLease(
        self, request: pb.RenewLeaseRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RenewLeaseResponse:
        lease = await self._store.renew_lease(
            user_id=d.validate_user_id(request.user_id),
            task_id=d.parse_id(request.task_id, "task_id"),
            ttl_ms=d.validate_ttl_ms(request.ttl_ms),
        )
        return pb.RenewLeaseResponse(lease=lease_to_pb(lease))

    @_grpc_errors
    async def ReleaseLease(
        self, request: pb.ReleaseLeaseRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ReleaseLeaseResponse:
        released = await self._store.release_lease(
            user_id=d.validate_user_id(request.user_id),
            task_id=d.parse_id(request.task_id, "task_id"),
        )
        return pb.ReleaseLeaseResponse(released=released)

    @_grpc_errors
    async def RequestStop(
        self, request: pb.RequestStopRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RequestStopResponse:
        lease = await self._store.request_stop(
            user_id=d.validate_user_id(request.user_id),
            task_id=d.parse_id(request.task_id, "task_id"),
        )
        return pb.RequestStopResponse(lease=lease_to_pb(lease))

    @_grpc_errors
    async def GetLease(
        self, request: pb.GetLeaseRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetLeaseResponse:
        lease = await self._store.get_lease(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
        )
        return pb.GetLeaseResponse(lease=lease_to_pb(lease) if lease is not None else None)

    @_grpc_errors
    async def ListCompactions(
        self, request: pb.ListCompactionsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListCompactionsResponse:
        compactions = await self._store.list_compactions(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
        )
        return pb.ListCompactionsResponse(compactions=[compaction_to_pb(c) for c in compactions])

    # ---------------------------------------------------- checkpoints (issue 15)

    @_grpc_errors
    async def PutCheckpoint(
        self, request: pb.PutCheckpointRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PutCheckpointResponse:
        size = len(request.checkpoint) + len(request.metadata_json)
        size += sum(len(v.value) for v in request.new_channel_values)
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
        with _timed(SAVE_DURATION):
            created = await self._store.put_checkpoint(
                user_id=d.validate_user_id(request.user_id),
                conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
                checkpoint=checkpoint,
                expected_head=expected,
            )
        return pb.PutCheckpointResponse(create_time=_timestamp(created))

    @_grpc_errors
    async def GetCheckpoint(
        self, request: pb.GetCheckpointRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetCheckpointResponse:
        with _timed(LOAD_DURATION):
            found = await self._store.get_checkpoint(
                user_id=d.validate_user_id(request.user_id),
                conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
                namespace=_namespace(request.namespace),
                checkpoint_id=_checkpoint_id(request.checkpoint_id, required=False) or None,
            )
        if found is None:
            return pb.GetCheckpointResponse()
        return pb.GetCheckpointResponse(checkpoint=checkpoint_to_pb(found))

    @_grpc_errors
    async def ListCheckpoints(
        self, request: pb.ListCheckpointsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListCheckpointsResponse:
        metadata_filter = None
        if request.metadata_filter_json:
            metadata_filter = d.check_metadata_json(
                request.metadata_filter_json, "metadata_filter_json"
            )
        page = await self._store.list_checkpoints(
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

    @_grpc_errors
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
        stored = await self._store.put_checkpoint_writes(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
            namespace=_namespace(request.namespace),
            checkpoint_id=_checkpoint_id(request.checkpoint_id),
            writes=writes,
        )
        return pb.PutCheckpointWritesResponse(writes_stored=stored)

    @_grpc_errors
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
            deleted = await self._store.delete_checkpoints_for_runs(
                user_id=user_id, run_ids=run_ids
            )
        return pb.DeleteCheckpointsForRunsResponse(checkpoints_deleted=deleted)

    @_grpc_errors
    async def CopyCheckpoints(
        self, request: pb.CopyCheckpointsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CopyCheckpointsResponse:
        source = d.parse_id(request.source_conversation_id, "source_conversation_id")
        target = d.parse_id(request.target_conversation_id, "target_conversation_id")
        if source == target:
            raise d.InvalidArgument("source and target conversation must differ")
        copied = await self._store.copy_checkpoints(
            user_id=d.validate_user_id(request.user_id),
            source_conversation_id=source,
            target_conversation_id=target,
        )
        return pb.CopyCheckpointsResponse(checkpoints_copied=copied)

    @_grpc_errors
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
        deleted = await self._store.prune_checkpoints(
            user_id=user_id, conversation_ids=ids, strategy=strategy
        )
        return pb.PruneCheckpointsResponse(checkpoints_deleted=deleted)

    # ------------------------------------- conversation items, scoped state

    def _new_item(self, item: pb.NewItem, what: str) -> d.NewItem:
        return d.NewItem(
            item_json=d.check_item_json(item.item_json, self._max_payload_bytes, what),
            item_time=item.item_time.ToDatetime(UTC) if item.HasField("item_time") else None,
        )

    @_grpc_errors
    async def AppendItems(
        self, request: pb.AppendItemsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.AppendItemsResponse:
        user_id = d.validate_user_id(request.user_id)
        conversation_id = d.parse_id(request.conversation_id, "conversation_id")
        if not 1 <= len(request.items) <= d.MAX_ITEMS_PER_APPEND:
            raise d.InvalidArgument(f"items must hold 1..{d.MAX_ITEMS_PER_APPEND} items")
        items = [self._new_item(item, f"items[{i}]") for i, item in enumerate(request.items)]
        appended = await self._store.append_items(
            user_id=user_id,
            conversation_id=conversation_id,
            items=items,
            expected_revision=_expected_revision(request),
        )
        return pb.AppendItemsResponse(
            items=[item_to_pb(i) for i in appended.items], revision=appended.revision
        )

    @_grpc_errors
    async def ListItems(
        self, request: pb.ListItemsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListItemsResponse:
        last_n: int | None = None
        if request.HasField("last_n"):
            last_n = request.last_n
            if last_n < 0:
                raise d.InvalidArgument("last_n must not be negative")
        page = await self._store.list_items(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
            last_n=last_n,
            min_item_time=(
                request.min_item_time.ToDatetime(UTC) if request.HasField("min_item_time") else None
            ),
            page_size=d.page_size(request.page_size, default=1000, maximum=10000),
            after_seq=d.parse_page_token(request.page_token),
        )
        return pb.ListItemsResponse(
            items=[item_to_pb(i) for i in page.items],
            next_page_token=page.next_page_token,
            revision=page.revision,
            update_time=_timestamp(page.update_time),
        )

    @_grpc_errors
    async def PopItem(
        self, request: pb.PopItemRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PopItemResponse:
        popped = await self._store.pop_item(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
            expected_revision=_expected_revision(request),
        )
        response = pb.PopItemResponse(revision=popped.revision)
        if popped.item is not None:
            response.item.CopyFrom(item_to_pb(popped.item))
        return response

    @_grpc_errors
    async def ClearItems(
        self, request: pb.ClearItemsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ClearItemsResponse:
        cleared = await self._store.clear_items(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
        )
        return pb.ClearItemsResponse(items_deleted=cleared.deleted, revision=cleared.revision)

    @_grpc_errors
    async def GetScopedState(
        self, request: pb.GetScopedStateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetScopedStateResponse:
        states = await self._store.get_scoped_state(
            user_id=d.validate_user_id(request.user_id),
            app_name=d.validate_app_name(request.app_name),
        )
        response = pb.GetScopedStateResponse()
        if states.app is not None:
            response.app_state.CopyFrom(_scoped_to_pb(states.app))
        if states.user is not None:
            response.user_state.CopyFrom(_scoped_to_pb(states.user))
        return response

    @_grpc_errors
    async def AppendEvent(
        self, request: pb.AppendEventRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.AppendEventResponse:
        user_id = d.validate_user_id(request.user_id)
        conversation_id = d.parse_id(request.conversation_id, "conversation_id")
        limit = self._max_payload_bytes
        # Only the conversation delta carries ADK's prefixes; the scoped ones are stored as given.
        app_delta = d.state_delta(request.app_state_delta_json, limit, "app_state_delta")
        user_delta = d.state_delta(request.user_state_delta_json, limit, "user_state_delta")
        event = d.EventAppend(
            item=self._new_item(request.item, "item") if request.HasField("item") else None,
            expected_revision=_expected_revision(request),
            state_key=d.validate_state_key(request.state_key),
            state_delta=d.without_temp_keys(request.state_delta_json, limit, "state_delta"),
            app_name=(
                d.validate_app_name(request.app_name)
                if app_delta or user_delta or request.app_name
                else ""
            ),
            app_delta=app_delta,
            user_delta=user_delta,
        )
        appended = await self._store.append_event(
            user_id=user_id, conversation_id=conversation_id, event=event
        )
        response = pb.AppendEventResponse(
            revision=appended.revision, state_version=appended.state_version
        )
        if appended.item is not None:
            response.item.CopyFrom(item_to_pb(appended.item))
        return response


def _expected_revision(
    request: pb.AppendItemsRequest | pb.PopItemRequest | pb.AppendEventRequest,
) -> int | None:
    if not request.HasField("expected_revision"):
        return None
    if request.expected_revision < 0:
        raise d.InvalidArgument("expected_revision must not be negative")
    return request.expected_revision


def item_to_pb(item: d.ConversationItem) -> pb.ConversationItem:
    return pb.ConversationItem(
        conversation_id=str(item.conversation_id),
        seq=item.seq,
        item_json=item.item_json,
        item_time=_timestamp(item.item_time),
        create_time=_timestamp(item.create_time),
    )


def _scoped_to_pb(state: d.StoredState) -> pb.ScopedState:
    return pb.ScopedState(
        payload=state.payload, version=state.version, update_time=_timestamp(state.update_time)
    )
