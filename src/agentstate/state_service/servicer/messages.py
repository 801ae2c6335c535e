"""Message records and compaction records: AppendMessage, UpdateMessage, ListMessages,
GetMessage, ListCompactions."""

from __future__ import annotations

from typing import Any

import grpc

from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state_service import domain as d
from agentstate.state_service.servicer.base import ServicerBase
from agentstate.state_service.servicer.translate import grpc_errors, timestamp

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


def message_to_pb(record: d.MessageRecord) -> pb.MessageRecord:
    return pb.MessageRecord(
        message_id=str(record.message_id),
        conversation_id=str(record.conversation_id),
        user_id=record.user_id,
        role=_ROLE_TO_PB[record.role],
        blocks_json=record.blocks_json,
        status=_STATUS_TO_PB[record.status],
        metadata_json=record.metadata_json,
        create_time=timestamp(record.create_time),
        update_time=timestamp(record.update_time),
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
        record.create_time.CopyFrom(timestamp(compaction.create_time))
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


class MessageRpcs(ServicerBase):
    @grpc_errors
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

    @grpc_errors
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

    @grpc_errors
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

    @grpc_errors
    async def GetMessage(
        self, request: pb.GetMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetMessageResponse:
        record = await self._store.get_message(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
            message_id=d.parse_id(request.message_id, "message_id"),
        )
        return pb.GetMessageResponse(message=message_to_pb(record))

    @grpc_errors
    async def ListCompactions(
        self, request: pb.ListCompactionsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListCompactionsResponse:
        compactions = await self._store.list_compactions(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
        )
        return pb.ListCompactionsResponse(compactions=[compaction_to_pb(c) for c in compactions])
