"""The events a turn emits, in the order the stream carries them: Meta, then Delta /
ToolStatus / Hint / Progress, then one of Finished / CardShown / Cancelled, then Done."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


class DeltaKind(enum.StrEnum):
    THINKING = "thinking"
    RESPONSE = "response"
    ERROR = "error"


class CallStatus(enum.StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ASKING = "asking"
    DENIED = "denied"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class Meta:
    conversation_id: str
    task_id: str
    new_conversation: bool


@dataclass(frozen=True)
class Delta:
    kind: DeltaKind
    text: str


@dataclass(frozen=True)
class ToolStatus:
    call_id: str
    name: str
    status: CallStatus
    arguments: dict[str, Any]
    summary: str = ""


@dataclass(frozen=True)
class Hint:
    text: str


@dataclass(frozen=True)
class Progress:
    """The model has been silent a while: attempt k of n, seconds since the call began."""

    attempt: int
    attempts: int
    elapsed_seconds: float
    note: str = ""


@dataclass(frozen=True)
class Finished:
    message_id: str


@dataclass(frozen=True)
class CardCall:
    call_id: str
    name: str
    title: str
    fields: list[tuple[str, str]]
    arguments: dict[str, Any]


@dataclass(frozen=True)
class CardShown:
    message_id: str
    title: str
    calls: list[CardCall]
    expire_time: datetime
    card: dict[str, Any]  # as stored in the message record's and the state's metadata


@dataclass(frozen=True)
class Cancelled:
    message_id: str
    reason: str


@dataclass(frozen=True)
class Done:
    extra: dict[str, Any] = field(default_factory=dict)


TurnEvent = Meta | Delta | ToolStatus | Hint | Progress | Finished | CardShown | Cancelled | Done
Emit = Callable[[TurnEvent], Awaitable[None]]
