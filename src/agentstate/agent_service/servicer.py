"""AgentService servicer: protobuf in, runtime calls, protobuf events out."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent.v1 import agent_service_pb2_grpc as pb_grpc
from agentstate.agent_service import errors
from agentstate.agent_service.auth import Authenticator
from agentstate.agent_service.client_state_port import ClientStatePort
from agentstate.agent_service.context.rag_history import (
    DEFAULT_TURNS,
    MAX_TURNS,
    HistoryRecord,
    rag_history,
)
from agentstate.agent_service.error_reasons import agent_error_detail
from agentstate.agent_service.events import (
    CallStatus,
    Cancelled,
    CardShown,
    Delta,
    DeltaKind,
    Done,
    Emit,
    Finished,
    Hint,
    Meta,
    Progress,
    ToolStatus,
    TurnEvent,
)
from agentstate.agent_service.runtime import TurnRunner
from agentstate.client.types import Conversation, MessageRecord, MessageRole, MessageStatus
from agentstate.common import error_details
from agentstate.state.v1 import state_service_pb2 as spb

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
Response = TypeVar("Response")

_STATUS_CODES: dict[type[errors.AgentError], grpc.StatusCode] = {
    errors.InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.Conflict: grpc.StatusCode.FAILED_PRECONDITION,
    errors.StateVersionConflict: grpc.StatusCode.ABORTED,
    errors.LimitReached: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.InternalError: grpc.StatusCode.INTERNAL,
}

_DELTA_TYPES = {
    DeltaKind.THINKING: pb.MESSAGE_TYPE_THINKING,
    DeltaKind.RESPONSE: pb.MESSAGE_TYPE_RESPONSE,
    DeltaKind.ERROR: pb.MESSAGE_TYPE_ERROR,
}
_CALL_STATUSES = {
    CallStatus.RUNNING: pb.TOOL_CALL_STATUS_RUNNING,
    CallStatus.SUCCEEDED: pb.TOOL_CALL_STATUS_SUCCEEDED,
    CallStatus.FAILED: pb.TOOL_CALL_STATUS_FAILED,
    CallStatus.ASKING: pb.TOOL_CALL_STATUS_ASKING,
    CallStatus.DENIED: pb.TOOL_CALL_STATUS_DENIED,
    CallStatus.INTERRUPTED: pb.TOOL_CALL_STATUS_INTERRUPTED,
}


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


def event_to_pb(event: TurnEvent) -> pb.TurnEvent:
    if isinstance(event, Meta):
        return pb.TurnEvent(
            meta=pb.MetaEvent(
                conversation_id=event.conversation_id,
                task_id=event.task_id,
                new_conversation=event.new_conversation,
            )
        )
    if isinstance(event, Delta):
        return pb.TurnEvent(
            message=pb.MessageEvent(type=_DELTA_TYPES[event.kind], delta=event.text)
        )
    if isinstance(event, ToolStatus):
        return pb.TurnEvent(
            block=pb.BlockEvent(
                call_id=event.call_id,
                tool_name=event.name,
                status=_CALL_STATUSES[event.status],
                arguments_json=_json(event.arguments),
                summary=event.summary,
            )
        )
    if isinstance(event, Hint):
        return pb.TurnEvent(hint=pb.HintEvent(text=event.text))
    if isinstance(event, Progress):
        return pb.TurnEvent(
            progress=pb.ProgressEvent(
                attempt=event.attempt,
                attempts=event.attempts,
                elapsed_ms=int(event.elapsed_seconds * 1000),
                note=event.note,
            )
        )
    if isinstance(event, Finished):
        return pb.TurnEvent(
            finish=pb.FinishEvent(
                message_id=event.message_id,
                status=spb.MESSAGE_STATUS_NORMAL,
                record_status=pb.MESSAGE_STATUS_NORMAL,
            )
        )
    if isinstance(event, CardShown):
        expire = Timestamp()
        expire.FromDatetime(event.expire_time)
        return pb.TurnEvent(
            confirm=pb.ConfirmEvent(
                message_id=event.message_id,
                title=event.title,
                expire_time=expire,
                calls=[
                    pb.ConfirmCall(
                        call_id=call.call_id,
                        tool_name=call.name,
                        title=call.title,
                        display_fields=[
                            pb.DisplayField(label=label, value=value)
                            for label, value in call.fields
                        ],
                        arguments_json=_json(call.arguments),
                    )
                    for call in event.calls
                ],
            )
        )
    if isinstance(event, Cancelled):
        return pb.TurnEvent(cancel=pb.CancelEvent(message_id=event.message_id, reason=event.reason))
    return pb.TurnEvent(done=pb.DoneEvent())


async def _abort(context: Context, error: errors.AgentError) -> NoReturn:
    """End the call with the error's status and its google.rpc.ErrorInfo detail."""
    # The nearest class in the table: a subclass (CardPending) answers as its base does.
    code = next(
        (_STATUS_CODES[k] for k in type(error).__mro__ if k in _STATUS_CODES),
        grpc.StatusCode.INTERNAL,
    )
    detail = agent_error_detail(error, code)
    await error_details.abort(context, code, str(error), detail)


def _grpc_errors(
    handler: Callable[[Any, Any, Context], Awaitable[Response]],
) -> Callable[[Any, Any, Context], Awaitable[Response]]:
    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: Context) -> Response:
        try:
            return await handler(self, request, context)
        except errors.AgentError as exc:
            await _abort(context, exc)

    return wrapper


_ROLES = {MessageRole.USER: pb.MESSAGE_ROLE_USER, MessageRole.ASSISTANT: pb.MESSAGE_ROLE_ASSISTANT}
_STATUSES = {
    MessageStatus.NORMAL: pb.MESSAGE_STATUS_NORMAL,
    MessageStatus.AWAITING_CONFIRM: pb.MESSAGE_STATUS_AWAITING_CONFIRM,
    MessageStatus.INTERRUPTED: pb.MESSAGE_STATUS_INTERRUPTED,
    MessageStatus.ERROR: pb.MESSAGE_STATUS_ERROR,
    MessageStatus.STREAMING: pb.MESSAGE_STATUS_STREAMING,
}


def _timestamp(value: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp


def conversation_to_pb(conversation: Conversation) -> pb.Conversation:
    message = pb.Conversation(
        conversation_id=conversation.conversation_id,
        title=conversation.title,
        create_time=_timestamp(conversation.create_time),
        update_time=_timestamp(conversation.update_time),
        status=spb.ConversationStatus.Value(f"CONVERSATION_STATUS_{conversation.status}"),
        labels=dict(conversation.labels),
    )
    if conversation.last_turn_time is not None:
        message.last_turn_time.CopyFrom(_timestamp(conversation.last_turn_time))
    return message


def record_to_pb(record: MessageRecord) -> pb.MessageRecord:
    return pb.MessageRecord(
        message_id=record.message_id,
        conversation_id=record.conversation_id,
        role=_ROLES[record.role],
        blocks_json=record.blocks_json,
        status=_STATUSES[record.status],
        metadata_json=record.metadata_json,
        create_time=_timestamp(record.create_time),
        update_time=_timestamp(record.update_time),
    )


# The deprecated v1 fields that carry the state service's own types (agent_service.proto).
_LEGACY_STATUSES = {
    status: spb.MessageStatus.Value(f"MESSAGE_STATUS_{status.value}") for status in MessageStatus
}
_LEGACY_ROLES = {role: spb.MessageRole.Value(f"MESSAGE_ROLE_{role.value}") for role in MessageRole}


def legacy_conversation(conversation: Conversation, user_id: str) -> spb.Conversation:
    return spb.Conversation(
        conversation_id=conversation.conversation_id,
        user_id=user_id,
        title=conversation.title,
        create_time=_timestamp(conversation.create_time),
        update_time=_timestamp(conversation.update_time),
    )


def legacy_record(record: MessageRecord, user_id: str) -> spb.MessageRecord:
    return spb.MessageRecord(
        message_id=record.message_id,
        conversation_id=record.conversation_id,
        user_id=user_id,
        role=_LEGACY_ROLES[record.role],
        blocks_json=record.blocks_json,
        status=_LEGACY_STATUSES[record.status],
        metadata_json=record.metadata_json,
        create_time=_timestamp(record.create_time),
        update_time=_timestamp(record.update_time),
    )


class AgentServicer(pb_grpc.AgentServiceServicer):
    def __init__(self, runner: TurnRunner, state: ClientStatePort, auth: Authenticator) -> None:
        self._runner = runner
        self._state = state
        self._auth = auth

    async def _user(self, context: Context) -> str:
        """The calling end user: the first thing every RPC does (agent_service/auth.py)."""
        return await self._auth.user_id(
            tuple(context.invocation_metadata() or ()), peer=context.peer()
        )

    async def _stream_turn(
        self, context: Context, run: Callable[[str, Emit], Awaitable[None]]
    ) -> AsyncIterator[pb.TurnEvent]:
        """Run a turn for the calling user as its own task and stream its events.

        The turn is not tied to the call: if the client goes away, the turn
        still finishes and saves.
        """
        try:
            user_id = await self._user(context)
        except errors.AgentError as refused:
            await _abort(context, refused)
        queue: asyncio.Queue[TurnEvent | None] = asyncio.Queue()

        async def emit(event: TurnEvent) -> None:
            await queue.put(event)

        async def turn() -> None:
            try:
                await run(user_id, emit)
            finally:
                await queue.put(None)

        task = asyncio.create_task(turn())
        while True:
            event = await queue.get()
            if event is None:
                break
            yield event_to_pb(event)
            if isinstance(event, Done):
                break
        await asyncio.wait([task])
        exc = None if task.cancelled() else task.exception()
        if isinstance(exc, errors.AgentError):
            await _abort(context, exc)
        if exc is not None:
            log.error("turn failed", exc_info=exc)
            await _abort(context, errors.InternalError(f"the turn failed: {exc}"))

    async def Chat(
        self, request: pb.ChatRequest, context: Context
    ) -> AsyncIterator[pb.ChatResponse]:
        async for event in self._stream_turn(
            context,
            lambda user_id, emit: self._runner.chat(
                user_id, request.conversation_id, request.question, emit
            ),
        ):
            yield pb.ChatResponse(event=event)

    async def Confirm(
        self, request: pb.ConfirmRequest, context: Context
    ) -> AsyncIterator[pb.ConfirmResponse]:
        async for event in self._stream_turn(
            context,
            lambda user_id, emit: self._runner.confirm(
                user_id, request.conversation_id, request.message_id, request.approved, emit
            ),
        ):
            yield pb.ConfirmResponse(event=event)

    @_grpc_errors
    async def Stop(self, request: pb.StopRequest, context: Context) -> pb.StopResponse:
        user_id = await self._user(context)
        if not request.task_id:
            raise errors.InvalidInput("task_id is required")
        conversation_id = await self._runner.stop(user_id, request.task_id)
        return pb.StopResponse(conversation_id=conversation_id)

    @_grpc_errors
    async def ListConversations(
        self, request: pb.ListConversationsRequest, context: Context
    ) -> pb.ListConversationsResponse:
        user_id = await self._user(context)
        statuses = [
            spb.ConversationStatus.Name(s).removeprefix("CONVERSATION_STATUS_")
            if s in spb.ConversationStatus.values()
            else "UNSPECIFIED"
            for s in request.statuses
        ]
        page = await self._state.search_conversations(
            user_id,
            request.page_size,
            request.page_token,
            title_prefix=request.title_prefix,
            statuses=statuses,
            label_selector=request.label_selector,
        )
        return pb.ListConversationsResponse(
            items=[conversation_to_pb(c) for c in page.items],
            conversations=[legacy_conversation(c, user_id) for c in page.items],
            next_page_token=page.next_page_token,
        )

    @_grpc_errors
    async def ListMessages(
        self, request: pb.ListMessagesRequest, context: Context
    ) -> pb.ListMessagesResponse:
        user_id = await self._user(context)
        page = await self._state.list_messages(
            user_id,
            request.conversation_id,
            request.page_size,
            request.page_token,
            newest_first=request.newest_first,
        )
        return pb.ListMessagesResponse(
            records=[record_to_pb(r) for r in page.items],
            messages=[legacy_record(r, user_id) for r in page.items],
            next_page_token=page.next_page_token,
        )

    @_grpc_errors
    async def RenameConversation(
        self, request: pb.RenameConversationRequest, context: Context
    ) -> pb.RenameConversationResponse:
        user_id = await self._user(context)
        conversation = await self._state.rename_conversation(
            user_id, request.conversation_id, request.title
        )
        return pb.RenameConversationResponse(
            renamed=conversation_to_pb(conversation),
            conversation=legacy_conversation(conversation, user_id),
        )

    @_grpc_errors
    async def DeleteConversation(
        self, request: pb.DeleteConversationRequest, context: Context
    ) -> pb.DeleteConversationResponse:
        user_id = await self._user(context)  # who is asking comes first, as in every RPC
        if not request.conversation_id:
            # Said for this RPC, not as the batch's conversation_ids[0] it becomes.
            raise errors.InvalidInput("conversation_id is required")
        deleted = await self._state.delete_conversations(user_id, [request.conversation_id])
        return pb.DeleteConversationResponse(messages_deleted=deleted.messages)

    @_grpc_errors
    async def BatchDeleteConversations(
        self, request: pb.BatchDeleteConversationsRequest, context: Context
    ) -> pb.BatchDeleteConversationsResponse:
        user_id = await self._user(context)
        deleted = await self._state.delete_conversations(user_id, list(request.conversation_ids))
        return pb.BatchDeleteConversationsResponse(conversations_deleted=deleted.conversations)

    @_grpc_errors
    async def GetRagHistory(
        self, request: pb.GetRagHistoryRequest, context: Context
    ) -> pb.GetRagHistoryResponse:
        user_id = await self._user(context)
        # The paging rule of every list RPC (docs/reference/state-rpcs.md): 0 is the
        # default, a number above the maximum is the maximum, a negative one is refused.
        if request.turns < 0:
            raise errors.InvalidInput("turns must not be negative")
        turns = min(request.turns or DEFAULT_TURNS, MAX_TURNS)
        # Read the tail, newest first, until it holds more user messages than turns.
        records: list[MessageRecord] = []
        token = ""
        while True:
            page = await self._state.list_messages(
                user_id, request.conversation_id, 200, token, newest_first=True
            )
            records.extend(page.items)
            token = page.next_page_token
            users = sum(1 for r in records if r.role is MessageRole.USER)
            if not token or users > turns:
                break
        history = rag_history(
            (
                HistoryRecord(
                    role="user" if r.role is MessageRole.USER else "assistant",
                    blocks_json=r.blocks_json,
                    complete=r.status not in (MessageStatus.STREAMING, MessageStatus.ERROR),
                )
                for r in reversed(records)
            ),
            turns,
        )
        return pb.GetRagHistoryResponse(
            messages=[pb.HistoryMessage(role=m.role, text=m.text) for m in history]
        )
