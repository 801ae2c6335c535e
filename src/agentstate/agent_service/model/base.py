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

from agentstate.agent_service.agent_state import Msg, Role, TextBlock, ToolResultBlock, ToolUseBlock


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


@dataclass(frozen=True)
class Waiting:
    """The model has not answered for a while: the call is still on (attempt `attempt` of
    `attempts`, `elapsed_seconds` since it began), or it failed and is retried (`note`
    says why). For the user's progress line; it carries no content."""

    attempt: int
    attempts: int
    elapsed_seconds: float
    note: str = ""


ModelEvent = ThinkingDelta | TextDelta | ToolCall | Usage | Waiting


class ModelError(Exception):
    """The model could not produce a reply (transport, protocol or provider error).

    `str(error)` is the operator's account (endpoint, model, provider message, which
    setting to check): it goes to logs and ErrorInfo metadata, never to a message
    text. `public` says what happened without internals, for the caller's status
    message; `cause` is a short stable word (`http_503`, `timeout`, `connection`,
    `bad_response`, `empty_response`, `stream_error`, `tool_call`, `error`) and
    `attempts` how many HTTP requests were made (retries included).
    """

    def __init__(
        self, detail: str, *, public: str = "", cause: str = "error", attempts: int = 1
    ) -> None:
        super().__init__(detail)
        self.public = public or "the model could not produce a reply"
        self.cause = cause
        self.attempts = attempts
        self.retry_after: float | None = None  # the provider's retry-after, when it sent one


class ChatModel(abc.ABC):
    """One streamed model call per ReAct step."""

    name: str = "model"

    @abc.abstractmethod
    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Yield deltas in order; tool calls complete (arguments parsed) once known.

        Raises ModelError on failure.
        """

    async def summarize(
        self, previous_summary: str, messages: Sequence[Msg], max_tokens: int
    ) -> str:
        """Write the running summary that replaces `messages` in the context.

        By default the model itself writes it, from a plain transcript.
        """
        prompt = (
            "Update the running summary of this conversation with the transcript below. "
            "Keep every fact a later question may need: what the user said about themselves, "
            "order numbers, amounts, statuses, decisions and their outcomes. "
            f"Use at most {max_tokens} tokens. "
            "Answer with the summary only, in the conversation's language.\n\n"
            f"Current summary:\n{previous_summary or '(none)'}\n\nTranscript:\n"
            f"{render_transcript(messages)}"
        )
        request = ModelRequest(
            system_prompt="You write faithful, compact conversation summaries.",
            context=[Msg(role=Role.USER, name="user", content=[TextBlock(prompt)])],
        )
        parts = [event.text async for event in self.stream(request) if isinstance(event, TextDelta)]
        summary = "".join(parts).strip()
        if not summary:
            raise ModelError("the model returned an empty summary")
        return summary


def render_transcript(messages: Sequence[Msg]) -> str:
    lines = []
    for msg in messages:
        for block in msg.content:
            if isinstance(block, TextBlock):
                lines.append(f"{msg.role.value.lower()}: {block.text}")
            elif isinstance(block, ToolUseBlock):
                lines.append(f"tool call {block.name} {block.input}")
            elif isinstance(block, ToolResultBlock):
                lines.append(f"tool result {block.name} ({block.state.value}): {block.text}")
    return "\n".join(lines)
