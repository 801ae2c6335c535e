"""The model interface the ReAct loop talks to.

A model receives the context the runtime prepared (already trimmed and rewritten
by middlewares: a copy, never the stored state) and the tools it may call, and
streams back thinking, text and tool calls.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_service.agent_state import Msg


@dataclass(frozen=True)
class ToolSpec:
    """What the model is told about a tool."""

    name: str
    description: str
    parameters: dict[str, Any]  # JSON Schema of the arguments object


@dataclass(frozen=True)
class ModelRequest:
    system_prompt: str
    context: Sequence[Msg]
    tools: Sequence[ToolSpec] = ()
    summary: str = ""  # the state's summary of compacted history, if any


@dataclass(frozen=True)
class ThinkingDelta:
    text: str


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int


ModelEvent = ThinkingDelta | TextDelta | ToolCall | Usage


class ModelError(Exception):
    """The model could not produce a reply (transport, protocol or provider error)."""


class ChatModel(abc.ABC):
    """One streamed model call per ReAct step."""

    name: str = "model"

    @abc.abstractmethod
    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Yield deltas in order; tool calls complete (arguments parsed) once known.

        Raises ModelError on failure.
        """
