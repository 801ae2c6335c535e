"""Message records for UI replay, their writes, and compaction records."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from agentstate.state_service.domain.errors import InvalidArgument
from agentstate.state_service.domain.rules import (
    JSON_ARRAY_START,
    JSON_OBJECT_START,
    check_json_bytes,
    check_json_depth,
)


class MessageRole(enum.StrEnum):
    USER = "USER"
    ASSISTANT = "ASSISTANT"


class MessageStatus(enum.StrEnum):
    NORMAL = "NORMAL"
    AWAITING_CONFIRM = "AWAITING_CONFIRM"
    INTERRUPTED = "INTERRUPTED"
    ERROR = "ERROR"
    STREAMING = "STREAMING"


@dataclass(frozen=True)
class MessageRecord:
    message_id: int
    conversation_id: int
    user_id: str
    role: MessageRole
    blocks_json: bytes
    status: MessageStatus
    metadata_json: bytes
    create_time: datetime
    update_time: datetime


@dataclass(frozen=True)
class NewMessage:
    role: MessageRole
    blocks_json: bytes = b"[]"
    status: MessageStatus = MessageStatus.NORMAL
    metadata_json: bytes = b"{}"


@dataclass(frozen=True)
class MessageUpdate:
    message_id: int
    status: MessageStatus | None = None
    blocks_json: bytes | None = None
    metadata_json: bytes | None = None
    expected_status: MessageStatus | None = None


MessageWrite = NewMessage | MessageUpdate


@dataclass(frozen=True)
class Compaction:
    """An audit record of one context compaction (ids and time set by the store)."""

    messages_before: int
    messages_after: int
    tokens_before: int
    tokens_after: int
    summary_chars: int
    reason: str
    compaction_id: int = 0
    create_time: datetime | None = None


def check_blocks_json(blocks: bytes, what: str = "blocks_json") -> bytes:
    if not blocks:
        return b"[]"
    if not JSON_ARRAY_START.match(blocks):
        raise InvalidArgument(f"{what} must be a JSON array")
    check_json_bytes(blocks, what)
    check_json_depth(blocks, what)
    return blocks


def check_metadata_json(metadata: bytes, what: str = "metadata_json") -> bytes:
    if not metadata:
        return b"{}"
    if not JSON_OBJECT_START.match(metadata):
        raise InvalidArgument(f"{what} must be a JSON object")
    check_json_bytes(metadata, what)
    check_json_depth(metadata, what)
    return metadata
