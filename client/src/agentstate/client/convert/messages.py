"""Messages and compaction records: AppendMessage, UpdateMessage, GetMessage, ListMessages,
ListCompactions, and the message writes and compaction notes a save carries."""

from __future__ import annotations

from agentstate.client.convert._common import Op, json_bytes, time_of
from agentstate.client.types import (
    Compaction,
    CompactionNote,
    MessageRecord,
    MessageRole,
    MessageStatus,
    MessageUpdate,
    MessageWrite,
    NewMessage,
    Page,
)
from agentstate.state.v1 import state_service_pb2 as pb

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


def record_of(message: pb.MessageRecord) -> MessageRecord:
    return MessageRecord(
        message_id=message.message_id,
        conversation_id=message.conversation_id,
        role=_ROLE_OF[message.role],
        blocks_json=message.blocks_json,
        status=_STATUS_OF[message.status],
        metadata_json=message.metadata_json,
        create_time=time_of(message.create_time),
        update_time=time_of(message.update_time),
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
    created = time_of(message.create_time) if message.HasField("create_time") else None
    return Compaction(message.compaction_id, note, created)


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
