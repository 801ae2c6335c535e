"""A ChatModel for any OpenAI-compatible chat-completions endpoint.

Built on the official `openai` SDK (`AsyncOpenAI`), always streaming. Works against
OpenAI itself and against compatible providers (DeepSeek, vLLM, Ollama, ...) by
pointing OPENAI_BASE_URL at them.

Mapping of the conversation (the runtime's already-prepared copy):

- the system prompt goes first; a non-empty state summary is appended to it as a
  labelled section;
- USER messages become {"role": "user"} with their text (messages without text are
  skipped);
- ASSISTANT messages become {"role": "assistant"} with their text and tool calls;
  thinking is never sent back;
- each tool result of a TOOL message becomes one {"role": "tool"} message.

Streaming: DeepSeek-style `reasoning_content` deltas become ThinkingDelta, content
deltas TextDelta. Tool-call fragments are joined by their `index` and each call is
yielded, complete and parsed, once the stream has ended; then one Usage, if the
provider reported any. Every SDK failure is raised as ModelError.

Waits have their own limits, so a hung endpoint never keeps a user minutes in silence:
the first byte of an attempt must come within OPENAI_FIRST_BYTE_TIMEOUT_SECONDS and no
gap between two chunks may exceed OPENAI_STALL_TIMEOUT_SECONDS. Retries are this
module's (not the SDK's), so each is known: a failure before anything was streamed is
retried up to OPENAI_MAX_RETRIES times, and while it waits the stream yields `Waiting`
(every PROGRESS_EVERY_SECONDS, and before each retry) for the user's progress line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import openai
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionChunk,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
    ChatCompletionToolMessageParam,
)
from openai.types.chat.chat_completion_chunk import ChoiceDelta, ChoiceDeltaToolCall
from pydantic import Field

from agentstate.agent_service.agent_state import Msg, Role, ToolResultBlock, ToolUseBlock
from agentstate.agent_service.model.base import (
    ChatModel,
    ModelError,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolSpec,
    Usage,
    Waiting,
)
from agentstate.common.config import EnvSettings

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "gpt-4o-mini"
DEFAULT_TIMEOUT_SECONDS = 60.0
DEFAULT_MAX_RETRIES = 2
DEFAULT_FIRST_BYTE_TIMEOUT_SECONDS = 20.0
DEFAULT_STALL_TIMEOUT_SECONDS = 20.0
PROGRESS_EVERY_SECONDS = 2.0
# Backoff before retry k (1-based): 0.5 s, 1 s, 2 s..., or the provider's retry-after when
# it is shorter than this cap.
_BACKOFF_SECONDS, _MAX_BACKOFF_SECONDS = 0.5, 8.0
_RETRYABLE = ("timeout", "connection", "http_408", "http_409", "http_429")

_T = TypeVar("_T")

SUMMARY_HEADING = "## Summary of the earlier conversation"

# Extra (non-OpenAI) delta fields that carry a reasoning model's thinking:
# DeepSeek, vLLM and SGLang use `reasoning_content`; OpenRouter and newer vLLM `reasoning`.
_REASONING_FIELDS = ("reasoning_content", "reasoning")


class OpenAISettings(EnvSettings):
    """Where and how to reach the chat-completions endpoint (read when AGENT_MODEL=openai)."""

    api_key: str = Field(
        validation_alias="OPENAI_API_KEY",
        repr=False,
        description=(
            "the endpoint's API key; for a local server that ignores it, set any placeholder value"
        ),
    )
    base_url: str = Field(
        default=DEFAULT_BASE_URL,
        validation_alias="OPENAI_BASE_URL",
        description="any OpenAI-compatible endpoint",
    )
    model: str = Field(
        default=DEFAULT_MODEL, validation_alias="OPENAI_MODEL", description="model name"
    )
    timeout_seconds: float = Field(
        default=DEFAULT_TIMEOUT_SECONDS,
        validation_alias="OPENAI_TIMEOUT_SECONDS",
        gt=0,
        description="one model call's time limit",
    )
    max_retries: int = Field(
        default=DEFAULT_MAX_RETRIES,
        validation_alias="OPENAI_MAX_RETRIES",
        ge=0,
        description=(
            "retries of a model call that failed before it streamed anything (timeouts, "
            "connection errors, HTTP 429 and 5xx), each told to the client as progress"
        ),
    )
    first_byte_timeout_seconds: float = Field(
        default=DEFAULT_FIRST_BYTE_TIMEOUT_SECONDS,
        validation_alias="OPENAI_FIRST_BYTE_TIMEOUT_SECONDS",
        gt=0,
        description="how long one attempt may wait for the endpoint's first byte",
    )
    stall_timeout_seconds: float = Field(
        default=DEFAULT_STALL_TIMEOUT_SECONDS,
        validation_alias="OPENAI_STALL_TIMEOUT_SECONDS",
        gt=0,
        description="the longest silence allowed between two chunks of a streaming answer",
    )


# --------------------------------------------------------------- request side


def system_content(system_prompt: str, summary: str) -> str:
    """The system prompt, with the summary of compacted history as its own section."""
    summary = summary.strip()
    if not summary:
        return system_prompt
    section = f"{SUMMARY_HEADING}\n\n{summary}"
    return f"{system_prompt.rstrip()}\n\n{section}" if system_prompt.strip() else section


def _tool_result_text(block: ToolResultBlock) -> str:
    # Some providers reject an empty tool message; say what happened instead.
    return block.text or f"[tool {block.name} returned no output; state: {block.state.value}]"


def _assistant_message(msg: Msg) -> ChatCompletionAssistantMessageParam | None:
    calls: list[ChatCompletionMessageFunctionToolCallParam] = [
        {
            "id": block.id,
            "type": "function",
            "function": {
                "name": block.name,
                "arguments": json.dumps(block.input, ensure_ascii=False),
            },
        }
        for block in msg.blocks_of(ToolUseBlock)
    ]
    text = msg.text
    if not text and not calls:
        return None  # e.g. only thinking: nothing the provider would accept
    message: ChatCompletionAssistantMessageParam = {"role": "assistant", "content": text or None}
    if calls:  # OpenAI rejects an empty tool_calls array
        message["tool_calls"] = calls
    return message


def to_chat_messages(request: ModelRequest) -> list[ChatCompletionMessageParam]:
    """The request's prompt and context as chat-completions messages."""
    messages: list[ChatCompletionMessageParam] = []
    system = system_content(request.system_prompt, request.summary)
    if system:
        messages.append({"role": "system", "content": system})
    for msg in request.context:
        if msg.role is Role.USER:
            if msg.text.strip():
                messages.append({"role": "user", "content": msg.text})
        elif msg.role is Role.ASSISTANT:
            assistant = _assistant_message(msg)
            if assistant is not None:
                messages.append(assistant)
        elif msg.role is Role.TOOL:
            for block in msg.blocks_of(ToolResultBlock):
                tool: ChatCompletionToolMessageParam = {
                    "role": "tool",
                    "tool_call_id": block.id,
                    "content": _tool_result_text(block),
                }
                messages.append(tool)
    return messages


def to_chat_tools(tools: Sequence[ToolSpec]) -> list[ChatCompletionFunctionToolParam]:
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            },
        }
        for tool in tools
    ]


# -------------------------------------------------------------- response side


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class _ToolCallAccumulator:
    """Joins tool-call fragments that arrive spread over chunks, keyed by `index`."""

    def __init__(self) -> None:
        self._calls: dict[int, _PartialCall] = {}

    def add(self, fragment: ChoiceDeltaToolCall) -> None:
        index: int | None = fragment.index
        if index is None:  # seen from some "compatible" servers: one call per fragment id
            known = next((i for i, c in self._calls.items() if c.id and c.id == fragment.id), None)
            if known is not None:
                index = known
            elif fragment.id or not self._calls:
                index = len(self._calls)
            else:
                index = max(self._calls)
        call = self._calls.setdefault(index, _PartialCall())
        if fragment.id:
            call.id = fragment.id
        function = fragment.function
        if function is not None:
            if function.name:
                call.name = function.name
            if function.arguments:
                call.arguments.append(function.arguments)

    def complete(self, finish_reason: str | None) -> list[ToolCall]:
        return [self._complete(self._calls[index], finish_reason) for index in sorted(self._calls)]

    @staticmethod
    def _complete(call: _PartialCall, finish_reason: str | None) -> ToolCall:
        public = "the model sent a tool call that cannot be read"
        if not call.name:
            raise ModelError(
                f"the model sent a tool call without a name (id {call.id!r})",
                public=public,
                cause="tool_call",
            )
        raw = "".join(call.arguments).strip()
        hint = " (the reply hit the output token limit)" if finish_reason == "length" else ""
        try:
            arguments = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise ModelError(
                f"the model sent invalid JSON arguments for tool {call.name!r}{hint}: "
                f"{exc}; arguments were {raw[:200]!r}",
                public=public,
                cause="tool_call",
            ) from None
        if not isinstance(arguments, dict):
            raise ModelError(
                f"the model sent arguments for tool {call.name!r} that are not a JSON object: "
                f"{raw[:200]!r}",
                public=public,
                cause="tool_call",
            )
        return ToolCall(
            id=call.id or f"call_{uuid.uuid4().hex}", name=call.name, arguments=arguments
        )


def _reasoning_text(delta: ChoiceDelta) -> str:
    for name in _REASONING_FIELDS:
        value = getattr(delta, name, None)
        if isinstance(value, str) and value:
            return value
    return ""


# ---------------------------------------------------------------------- model


class OpenAICompatModel(ChatModel):
    """Streams chat completions from an OpenAI-compatible endpoint."""

    def __init__(self, settings: OpenAISettings) -> None:
        self.settings = settings
        self.name = settings.model
        self._client = openai.AsyncOpenAI(
            api_key=settings.api_key,
            base_url=settings.base_url,
            timeout=settings.timeout_seconds,
            max_retries=0,  # retried here, where each attempt is known and told
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OpenAICompatModel:
        return cls(OpenAISettings.from_env(env))

    async def aclose(self) -> None:
        await self._client.close()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        attempts = self.settings.max_retries + 1
        started = time.monotonic()
        for attempt in range(1, attempts + 1):
            streamed = False
            try:
                async for event in self._attempt(request, attempt, attempts, started):
                    streamed = streamed or not isinstance(event, Waiting)
                    yield event
                return
            except ModelError as exc:
                exc.attempts = attempt
                if streamed or attempt == attempts or not _retryable(exc):
                    raise
                yield Waiting(
                    attempt + 1, attempts, time.monotonic() - started, f"retrying: {exc.public}"
                )
                await asyncio.sleep(_backoff(exc, attempt))

    async def _attempt(
        self, request: ModelRequest, attempt: int, attempts: int, started: float
    ) -> AsyncIterator[ModelEvent]:
        calls = _ToolCallAccumulator()
        usage: Usage | None = None
        finish_reason: str | None = None
        chunks = 0
        async for chunk in self._chunks(request, attempt, attempts, started):
            if isinstance(chunk, Waiting):
                yield chunk
                continue
            chunks += 1
            if chunk.usage is not None:
                # Some servers repeat a running total on every chunk: keep the last.
                usage = Usage(
                    input_tokens=chunk.usage.prompt_tokens or 0,
                    output_tokens=chunk.usage.completion_tokens or 0,
                )
            for choice in chunk.choices or ():
                if choice.index not in (0, None):
                    continue  # we never ask for n > 1
                if choice.finish_reason:
                    finish_reason = choice.finish_reason
                delta = choice.delta
                if delta is None:
                    continue
                thinking = _reasoning_text(delta)
                if thinking:
                    yield ThinkingDelta(thinking)
                if delta.content:
                    yield TextDelta(delta.content)
                if delta.refusal:
                    yield TextDelta(delta.refusal)
                for fragment in delta.tool_calls or ():
                    calls.add(fragment)
        if not chunks:
            # An HTTP 200 whose body held no event at all (empty, or not server-sent
            # events): an empty answer would be saved as if the model had said nothing.
            raise ModelError(
                f"{self._where()} answered HTTP 200 with no stream events",
                public="the model endpoint sent an empty response",
                cause="empty_response",
                attempts=attempt,
            )
        for call in calls.complete(finish_reason):
            yield call
        if usage is not None:
            yield usage

    async def _within(
        self,
        awaitable: Awaitable[_T],
        limit: float,
        timed_out: ModelError,
        progress: tuple[int, int, float],
        got: list[_T],
    ) -> AsyncIterator[Waiting]:
        """Await `awaitable` for at most `limit` seconds, yielding Waiting every
        PROGRESS_EVERY_SECONDS meanwhile; its result goes to `got`. Raises `timed_out`
        when the limit passes; a cancelled caller cancels it (and its HTTP request)."""
        task = asyncio.ensure_future(awaitable)
        deadline = time.monotonic() + limit
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise timed_out
                done, _ = await asyncio.wait({task}, timeout=min(PROGRESS_EVERY_SECONDS, left))
                if done:
                    got.append(task.result())
                    return
                attempt, attempts, started = progress
                yield Waiting(attempt, attempts, time.monotonic() - started)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    def _timed_out(self, what: str, limit: float, setting: str, attempt: int) -> ModelError:
        return ModelError(
            f"{self._where()} {what} within {limit:g}s (raise {setting} or retry)",
            public="the model call timed out",
            cause="timeout",
            attempts=attempt,
        )

    async def _chunks(
        self, request: ModelRequest, attempt: int, attempts: int, started: float
    ) -> AsyncIterator[ChatCompletionChunk | Waiting]:
        """The SDK's chunks, with every failure turned into a ModelError, and Waiting
        while the endpoint is silent."""
        tools = to_chat_tools(request.tools)
        progress = (attempt, attempts, started)
        opened: list[Any] = []
        try:
            async for tick in self._within(
                self._client.chat.completions.create(
                    model=self.settings.model,
                    messages=to_chat_messages(request),
                    tools=tools if tools else openai.omit,
                    stream=True,
                    stream_options={"include_usage": True},
                ),
                self.settings.first_byte_timeout_seconds,
                self._timed_out(
                    "sent no first byte",
                    self.settings.first_byte_timeout_seconds,
                    "OPENAI_FIRST_BYTE_TIMEOUT_SECONDS",
                    attempt,
                ),
                progress,
                opened,
            ):
                yield tick
        except openai.OpenAIError as exc:
            raise self._model_error(exc, attempt) from exc
        stream = opened[0]
        try:
            content_type = stream.response.headers.get("content-type", "")
            if content_type.split(";")[0].strip().lower() == "application/json":
                # A provider that ignored stream=true: the SDK would find no events in
                # it and report an empty answer.
                body = (await stream.response.aread())[:200]
                raise ModelError(
                    f"{self._where()} answered a streaming request with a JSON body "
                    f"instead of server-sent events: {body!r}",
                    public="the model endpoint sent a response that is not a stream",
                    cause="bad_response",
                    attempts=attempt,
                )
            stall = self._timed_out(
                "went silent mid-stream (no chunk)",
                self.settings.stall_timeout_seconds,
                "OPENAI_STALL_TIMEOUT_SECONDS",
                attempt,
            )
            while True:
                got: list[ChatCompletionChunk | None] = []
                try:
                    async for tick in self._within(
                        _next_chunk(stream),
                        self.settings.stall_timeout_seconds,
                        stall,
                        progress,
                        got,
                    ):
                        yield tick
                except openai.OpenAIError as exc:
                    raise self._model_error(exc, attempt) from exc
                except ValueError as exc:  # a data line that is not JSON
                    raise ModelError(
                        f"{self._where()} sent a malformed stream event: {exc}",
                        public="the model endpoint sent a malformed stream event",
                        cause="bad_response",
                        attempts=attempt,
                    ) from exc
                if got[0] is None:
                    return
                yield got[0]
        finally:
            await stream.close()

    def _where(self) -> str:
        return f"model endpoint {self.settings.base_url} (model {self.settings.model})"

    def _model_error(self, exc: openai.OpenAIError, attempt: int) -> ModelError:
        where = self._where()
        attempts = attempt
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            detail = _error_detail(exc)
            if status in (401, 403):
                hint = "check OPENAI_API_KEY"
            elif status == 404:
                hint = "check OPENAI_MODEL and OPENAI_BASE_URL"
            elif status == 429:
                hint = "rate limited or out of quota; retry later"
            elif status >= 500:
                hint = "provider-side error; retry later"
            else:
                hint = "the provider rejected the request"
            request_id = f", request id {exc.request_id}" if exc.request_id else ""
            error = ModelError(
                f"{where} returned HTTP {status}: {detail} ({hint}{request_id})",
                public=f"the model endpoint returned HTTP {status}",
                cause=f"http_{status}",
                attempts=attempts,
            )
            error.retry_after = _retry_after(exc)
            return error
        if isinstance(exc, openai.APITimeoutError):
            return ModelError(
                f"{where} timed out after {self.settings.timeout_seconds:g}s "
                "(raise OPENAI_TIMEOUT_SECONDS or retry)",
                public="the model call timed out",
                cause="timeout",
                attempts=attempts,
            )
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__
            reason = f": {cause}" if cause is not None and str(cause) else ""
            return ModelError(
                f"could not reach {where}{reason} (check OPENAI_BASE_URL and the network)",
                public="the model endpoint could not be reached",
                cause="connection",
                attempts=attempts,
            )
        if isinstance(exc, openai.APIError):
            return ModelError(
                f"{where} reported an error: {_error_detail(exc)}",
                public="the model endpoint reported an error in its stream",
                cause="stream_error",
                attempts=attempts,
            )
        return ModelError(f"{where}: {exc}", attempts=attempts)


async def _next_chunk(stream: Any) -> ChatCompletionChunk | None:
    """The next chunk, None at the end (StopAsyncIteration cannot cross a task)."""
    try:
        chunk: ChatCompletionChunk = await anext(stream)
        return chunk
    except StopAsyncIteration:
        return None


def _retryable(exc: ModelError) -> bool:
    return exc.cause in _RETRYABLE or exc.cause.startswith("http_5")


def _backoff(exc: ModelError, attempt: int) -> float:
    """Seconds before the next attempt: the provider's retry-after when it gave one (and
    it is short), else an exponential step."""
    after = exc.retry_after
    if after is not None and 0 <= after <= _MAX_BACKOFF_SECONDS:
        return after
    step: float = _BACKOFF_SECONDS * 2 ** (attempt - 1)
    return min(step, _MAX_BACKOFF_SECONDS)


def _retry_after(exc: openai.APIStatusError) -> float | None:
    headers = exc.response.headers
    try:
        if "retry-after-ms" in headers:
            return float(headers["retry-after-ms"]) / 1000
        if "retry-after" in headers:
            return float(headers["retry-after"])
    except ValueError:
        return None
    return None


def _error_detail(exc: openai.APIError) -> str:
    body: Any = exc.body
    if isinstance(body, dict):
        message = body.get("message")
        if isinstance(message, str) and message:
            return message
    if isinstance(body, str) and body:
        return body[:500]
    return exc.message
