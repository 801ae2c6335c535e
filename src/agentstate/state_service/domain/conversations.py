"""Conversations: their records, titles, external keys and deletion counts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from agentstate.state_service.domain.errors import InvalidArgument
from agentstate.state_service.domain.lifecycle import ConversationStatus, TimeToLive
from agentstate.state_service.domain.rules import check_no_nul

DEFAULT_TITLE = "New conversation"


MAX_TITLE_CHARS = 200


MAX_BATCH_DELETE = 1000


MAX_EXTERNAL_KEY_CHARS = 256


@dataclass(frozen=True)
class Conversation:
    conversation_id: int
    user_id: str
    title: str
    create_time: datetime
    update_time: datetime
    external_key: str = ""  # caller-chosen, unique per user; "" = none
    labels: Mapping[str, str] = field(default_factory=dict)
    ttl: TimeToLive | None = None
    expire_time: datetime | None = None
    status: ConversationStatus = ConversationStatus.IDLE
    last_turn_time: datetime | None = None


@dataclass(frozen=True)
class ResolvedConversation:
    conversation: Conversation
    created: bool


@dataclass(frozen=True)
class DeleteCounts:
    conversations: int
    messages: int
    states: int

    def __add__(self, other: DeleteCounts) -> DeleteCounts:
        return DeleteCounts(
            self.conversations + other.conversations,
            self.messages + other.messages,
            self.states + other.states,
        )


def normalize_title(title: str, *, default: str | None = None) -> str:
    check_no_nul(title, "title")
    cleaned = " ".join(title.split())
    if not cleaned:
        if default is None:
            raise InvalidArgument("title must not be empty")
        return default
    if len(cleaned) > MAX_TITLE_CHARS:
        raise InvalidArgument(f"title is longer than {MAX_TITLE_CHARS} characters")
    return cleaned


def validate_external_key(key: str, what: str = "external_key") -> str:
    if not key:
        raise InvalidArgument(f"{what} must not be empty")
    if len(key) > MAX_EXTERNAL_KEY_CHARS:
        raise InvalidArgument(f"{what} is over {MAX_EXTERNAL_KEY_CHARS} characters")
    return check_no_nul(key, what)
