"""The OpenAI-compatible model against a real local HTTP server.

The server speaks the chat-completions streaming wire format (server-sent events,
chunk objects shaped as OpenAI and DeepSeek send them) and records what it received,
so these tests exercise the real SDK over real HTTP: no SDK mocks.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from agentstate.agent_service.agent_state import (
    Msg,
    Role,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolResultState,
    ToolUseBlock,
)
from agentstate.agent_service.model.base import (
    ModelError,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolSpec,
    Usage,
)
from agentstate.agent_service.model.openai_compat import (
    SUMMARY_HEADING,
    OpenAICompatModel,
    OpenAISettings,
)
from agentstate.common.config import ConfigError

API_KEY = "sk-test-123"
JSON = dict[str, Any]

# ------------------------------------------------------------ the fake server


@dataclass
class Reply:
    """One scripted HTTP response."""

    status: int = 200
    events: list[str] = field(default_factory=list)  # SSE data payloads, [DONE] included
    body: JSON | None = None  # a JSON body instead of a stream
    headers: dict[str, str] = field(default_factory=dict)
    stall_seconds: float = 0.0  # wait this long before answering
    raw: bytes | None = None  # a body sent as is, with `content_type`
    content_type: str = "application/json"
    hang_after: int | None = None  # send this many events, then never another


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: JSON


class FakeChatServer:
    """A minimal HTTP/1.1 server for POST /v1/chat/completions, with keep-alive."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.received: list[Received] = []
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0
        self.hanging = asyncio.Event()  # a reply is hanging now
        self.hung_up: list[float] = []  # when the client closed a hanging request

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while await self._one_exchange(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _hang(self, reader: asyncio.StreamReader) -> None:
        """Send nothing more; note when the client gives up and closes the connection."""
        self.hanging.set()
        await reader.read(1)  # returns b"" when the client closes
        self.hung_up.append(time.monotonic())

    async def _one_exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False  # the client closed the connection
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, path, _ = request_line.split(" ", 2)
        headers: dict[str, str] = {}
        for line in header_lines:
            if line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        self.received.append(Received(method, path, headers, json.loads(raw) if raw else {}))

        if method != "POST" or path != "/v1/chat/completions":
            reply = Reply(status=404, body={"error": {"message": f"no route {method} {path}"}})
        elif self.replies:
            reply = self.replies.pop(0)
        else:
            reply = Reply(status=500, body={"error": {"message": "no reply scripted"}})
        if reply.stall_seconds:
            await asyncio.sleep(reply.stall_seconds)
        if reply.hang_after == 0:
            await self._hang(reader)  # not even the status line
            return False

        extra = "".join(f"{name}: {value}\r\n" for name, value in reply.headers.items())
        status_line = f"HTTP/1.1 {reply.status} {'OK' if reply.status == 200 else 'Error'}\r\n"
        if reply.raw is not None:
            writer.write(
                (
                    f"{status_line}Content-Type: {reply.content_type}\r\n"
                    f"Content-Length: {len(reply.raw)}\r\n{extra}\r\n"
                ).encode()
                + reply.raw
            )
            await writer.drain()
            return True
        if reply.body is not None:
            payload = json.dumps(reply.body).encode()
            writer.write(
                (
                    f"{status_line}Content-Type: application/json\r\n"
                    f"Content-Length: {len(payload)}\r\n{extra}\r\n"
                ).encode()
                + payload
            )
            await writer.drain()
            return True
        writer.write(
            (
                f"{status_line}Content-Type: text/event-stream; charset=utf-8\r\n"
                f"Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n{extra}\r\n"
            ).encode()
        )
        for index, data in enumerate(reply.events):
            if index == reply.hang_after:
                break
            event = f"data: {data}\n\n".encode()
            # One HTTP chunk per event, like a real server flushing as tokens arrive.
            writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            await writer.drain()
        if reply.hang_after is not None:
            await self._hang(reader)
            return False
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


# ------------------------------------------------------- wire-format helpers

CREATED = int(time.time())


def chunk(
    delta: JSON | None = None,
    finish_reason: str | None = None,
    *,
    model: str = "gpt-4o-mini-2024-07-18",
    usage: JSON | None = None,
    no_choices: bool = False,
) -> str:
    """One chat.completion.chunk, as OpenAI sends it with include_usage on."""
    choices: list[JSON] = (
        []
        if no_choices
        else [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish_reason}]
    )
    return json.dumps(
        {
            "id": "chatcmpl-test",
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "service_tier": "default",
            "system_fingerprint": "fp_test",
            "choices": choices,
            "usage": usage,
        },
        ensure_ascii=False,
    )


def usage_chunk(prompt: int, completion: int) -> str:
    return chunk(
        no_choices=True,
        usage={
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
        },
    )


def text_stream(*pieces: str, prompt: int = 10, completion: int = 3) -> Reply:
    events = [chunk({"role": "assistant", "content": "", "refusal": None})]
    events += [chunk({"content": piece}) for piece in pieces]
    events += [chunk({}, "stop"), usage_chunk(prompt, completion), "[DONE]"]
    return Reply(events=events)


def tool_call_start(index: int, call_id: str, name: str) -> JSON:
    return {
        "tool_calls": [
            {
                "index": index,
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
        ]
    }


def tool_call_args(index: int, fragment: str) -> JSON:
    return {"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# ------------------------------------------------------------------- fixtures


def settings_for(base_url: str, **overrides: Any) -> OpenAISettings:
    values: dict[str, Any] = {
        "api_key": API_KEY,
        "base_url": base_url,
        "model": "gpt-4o-mini",
        "timeout_seconds": 5.0,
        "max_retries": 0,
    }
    values.update(overrides)
    return OpenAISettings(**values)


@pytest.fixture
async def model(server: FakeChatServer) -> AsyncIterator[OpenAICompatModel]:
    chat = OpenAICompatModel(settings_for(server.base_url))
    yield chat
    await chat.aclose()


async def collect(model: OpenAICompatModel, request: ModelRequest) -> list[ModelEvent]:
    return [event async for event in model.stream(request)]


def ask(text: str = "你好", **kwargs: Any) -> ModelRequest:
    return ModelRequest(
        system_prompt="You are a helpful assistant.",
        context=[Msg(Role.USER, [TextBlock(text)])],
        **kwargs,
    )


ORDER_TOOL = ToolSpec(
    name="query_order",
    description="Look up the user's recent orders.",
    parameters={
        "type": "object",
        "properties": {"limit": {"type": "integer"}, "status": {"type": "string"}},
        "required": ["limit"],
    },
)
WEATHER_TOOL = ToolSpec(
    name="get_weather",
    description="Current weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)

# ---------------------------------------------------------------------- tests


async def test_streams_text_and_usage(server: FakeChatServer, model: OpenAICompatModel) -> None:
    server.script(text_stream("你", "好！", "How can I help?", prompt=21, completion=7))

    events = await collect(model, ask("你好"))

    assert events == [
        TextDelta("你"),
        TextDelta("好！"),
        TextDelta("How can I help?"),
        Usage(input_tokens=21, output_tokens=7),
    ]
    [received] = server.received
    assert received.method == "POST"
    assert received.path == "/v1/chat/completions"
    assert received.headers["authorization"] == f"Bearer {API_KEY}"
    assert received.body["model"] == "gpt-4o-mini"
    assert received.body["stream"] is True
    assert received.body["stream_options"] == {"include_usage": True}
    assert received.body["messages"] == [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "你好"},
    ]
    assert "tools" not in received.body  # an empty tools array is rejected by OpenAI


async def test_deepseek_reasoning_content_becomes_thinking(
    server: FakeChatServer, model: OpenAICompatModel
) -> None:
    def ds(delta: JSON, finish: str | None = None, usage: JSON | None = None) -> str:
        return chunk(delta, finish, model="deepseek-reasoner", usage=usage)

    server.script(
        Reply(
            events=[
                ds({"role": "assistant", "content": None, "reasoning_content": ""}),
                ds({"content": None, "reasoning_content": "用户在打招呼，"}),
                ds({"content": None, "reasoning_content": "礼貌回应。"}),
                ds({"content": "你好！", "reasoning_content": None}),
                # DeepSeek puts usage on the last chunk, next to finish_reason.
                ds(
                    {"content": "", "reasoning_content": None},
                    "stop",
                    usage={"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42},
                ),
                "[DONE]",
            ]
        )
    )

    events = await collect(model, ask())

    assert events == [
        ThinkingDelta("用户在打招呼，"),
        ThinkingDelta("礼貌回应。"),
        TextDelta("你好！"),
        Usage(input_tokens=12, output_tokens=30),
    ]


async def test_parallel_tool_calls_split_over_chunks(
    server: FakeChatServer, model: OpenAICompatModel
) -> None:
    server.script(
        Reply(
            events=[
                chunk({"role": "assistant", "content": "我来查一下。", "refusal": None}),
                chunk(tool_call_start(0, "call_1", "query_order")),
                chunk(tool_call_args(0, '{"lim')),
                chunk(tool_call_args(0, 'it": 3, "sta')),
                chunk(tool_call_start(1, "call_2", "get_weather")),
                chunk(tool_call_args(1, '{"city": "上')),
                chunk(tool_call_args(0, 'tus": "paid"}')),
                chunk(tool_call_args(1, '海"}')),
                chunk({}, "tool_calls"),
                usage_chunk(50, 40),
                "[DONE]",
            ]
        )
    )

    events = await collect(model, ask("查订单和天气", tools=[ORDER_TOOL, WEATHER_TOOL]))

    assert events == [
        TextDelta("我来查一下。"),
        ToolCall("call_1", "query_order", {"limit": 3, "status": "paid"}),
        ToolCall("call_2", "get_weather", {"city": "上海"}),
        Usage(input_tokens=50, output_tokens=40),
    ]
    [received] = server.received
    assert received.body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "query_order",
                "description": "Look up the user's recent orders.",
                "parameters": ORDER_TOOL.parameters,
            },
        },
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city.",
                "parameters": WEATHER_TOOL.parameters,
            },
        },
    ]


async def test_tool_call_without_arguments_parses_as_empty_object(
    server: FakeChatServer, model: OpenAICompatModel
) -> None:
    server.script(
        Reply(
            events=[
                chunk({"role": "assistant", "content": None}),
                chunk(tool_call_start(0, "call_9", "query_order")),
                chunk({}, "tool_calls"),
                "[DONE]",
            ]
        )
    )

    assert await collect(model, ask(tools=[ORDER_TOOL])) == [ToolCall("call_9", "query_order", {})]


async def test_context_is_sent_as_chat_messages(
    server: FakeChatServer, model: OpenAICompatModel
) -> None:
    server.script(text_stream("好的"))
    context = [
        Msg(Role.USER, [TextBlock("查一下我的订单和上海天气")]),
        Msg(
            Role.ASSISTANT,
            [
                ThinkingBlock("SECRET-THOUGHT: need two tools"),
                TextBlock("稍等。"),
                ToolUseBlock("call_1", "query_order", {"limit": 3}),
                ToolUseBlock("call_2", "get_weather", {"city": "上海"}),
            ],
        ),
        Msg(
            Role.TOOL,
            [
                ToolResultBlock.of_text(
                    "call_1", "query_order", ToolResultState.SUCCESS, "订单 A1001 已发货"
                ),
                ToolResultBlock.of_text(
                    "call_2", "get_weather", ToolResultState.ERROR, "weather service down"
                ),
            ],
        ),
        Msg(Role.ASSISTANT, [ThinkingBlock("SECRET-THOUGHT: only thinking")]),
        Msg(Role.ASSISTANT, [ToolUseBlock("call_3", "get_weather", {"city": "北京"})]),
        Msg(Role.TOOL, [ToolResultBlock("call_3", "get_weather", ToolResultState.SUCCESS, [])]),
        Msg(Role.USER, [TextBlock("")]),  # no text: skipped
        Msg(Role.USER, [TextBlock("谢谢")]),
    ]
    request = ModelRequest(
        system_prompt="You are a shop assistant.",
        context=context,
        tools=[ORDER_TOOL, WEATHER_TOOL],
        summary="The user asked about order A1000 earlier.",
    )

    await collect(model, request)

    [received] = server.received
    assert received.body["messages"] == [
        {
            "role": "system",
            "content": "You are a shop assistant.\n\n"
            f"{SUMMARY_HEADING}\n\nThe user asked about order A1000 earlier.",
        },
        {"role": "user", "content": "查一下我的订单和上海天气"},
        {
            "role": "assistant",
            "content": "稍等。",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "query_order", "arguments": '{"limit": 3}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "上海"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "订单 A1001 已发货"},
        {"role": "tool", "tool_call_id": "call_2", "content": "weather service down"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_3",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "北京"}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_3",
            "content": "[tool get_weather returned no output; state: success]",
        },
        {"role": "user", "content": "谢谢"},
    ]
    assert "SECRET-THOUGHT" not in json.dumps(received.body, ensure_ascii=False)


async def test_http_500_is_a_model_error(server: FakeChatServer, model: OpenAICompatModel) -> None:
    server.script(
        Reply(status=500, body={"error": {"message": "The server had an error", "type": "server"}})
    )

    with pytest.raises(ModelError, match="HTTP 500") as caught:
        await collect(model, ask())

    assert "The server had an error" in str(caught.value)
    assert len(server.received) == 1  # max_retries 0: no retry


async def test_http_401_is_a_model_error_naming_the_key(
    server: FakeChatServer, model: OpenAICompatModel
) -> None:
    server.script(
        Reply(
            status=401,
            body={
                "error": {
                    "message": "Incorrect API key provided: sk-test***123.",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            },
            headers={"x-request-id": "req_abc"},
        )
    )

    with pytest.raises(ModelError, match="HTTP 401") as caught:
        await collect(model, ask())

    message = str(caught.value)
    assert "Incorrect API key provided" in message
    assert "OPENAI_API_KEY" in message
    assert "req_abc" in message


async def test_retries_follow_settings(server: FakeChatServer) -> None:
    server.script(
        Reply(status=503, body={"error": {"message": "busy"}}, headers={"retry-after-ms": "10"}),
        text_stream("ok"),
    )
    chat = OpenAICompatModel(settings_for(server.base_url, max_retries=1))
    try:
        events = await collect(chat, ask())
    finally:
        await chat.aclose()

    assert TextDelta("ok") in events
    assert len(server.received) == 2


async def test_invalid_tool_call_json_is_a_model_error(
    server: FakeChatServer, model: OpenAICompatModel
) -> None:
    server.script(
        Reply(
            events=[
                chunk({"role": "assistant", "content": None}),
                chunk(tool_call_start(0, "call_1", "query_order")),
                chunk(tool_call_args(0, '{"limit": 3,')),
                chunk(tool_call_args(0, ' "status": ')),
                chunk({}, "tool_calls"),
                "[DONE]",
            ]
        )
    )

    with pytest.raises(ModelError, match="invalid JSON arguments for tool 'query_order'"):
        await collect(model, ask(tools=[ORDER_TOOL]))


async def test_error_event_inside_the_stream_is_a_model_error(
    server: FakeChatServer, model: OpenAICompatModel
) -> None:
    server.script(
        Reply(
            events=[
                chunk({"role": "assistant", "content": "部分"}),
                json.dumps({"error": {"message": "upstream overloaded", "type": "server_error"}}),
            ]
        )
    )

    events: list[ModelEvent] = []
    with pytest.raises(ModelError, match="upstream overloaded"):
        async for event in model.stream(ask()):
            events.append(event)
    assert events == [TextDelta("部分")]


async def test_connection_refused_is_a_model_error() -> None:
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    chat = OpenAICompatModel(settings_for(base_url))
    try:
        with pytest.raises(ModelError, match="could not reach") as caught:
            await collect(chat, ask())
    finally:
        await chat.aclose()
    assert base_url in str(caught.value)


async def test_timeout_is_a_model_error(server: FakeChatServer) -> None:
    server.script(Reply(stall_seconds=2.0, events=["[DONE]"]))
    chat = OpenAICompatModel(settings_for(server.base_url, timeout_seconds=0.2))
    try:
        with pytest.raises(ModelError, match=r"timed out after 0\.2s"):
            await collect(chat, ask())
    finally:
        await chat.aclose()


async def test_model_from_env_talks_to_the_configured_server(server: FakeChatServer) -> None:
    env = {
        "OPENAI_BASE_URL": server.base_url,
        "OPENAI_API_KEY": "sk-from-env",
        "OPENAI_MODEL": "deepseek-chat",
        "OPENAI_MAX_RETRIES": "0",
    }
    server.script(text_stream("hi"))
    chat = OpenAICompatModel.from_env(env)
    try:
        await collect(chat, ask())
    finally:
        await chat.aclose()

    [received] = server.received
    assert received.headers["authorization"] == "Bearer sk-from-env"
    assert received.body["model"] == "deepseek-chat"
    assert chat.name == "deepseek-chat"


def test_settings_defaults_and_overrides() -> None:
    defaults = OpenAISettings.from_env({"OPENAI_API_KEY": "sk-x"})
    assert defaults == OpenAISettings(
        api_key="sk-x",
        base_url="https://api.openai.com/v1",
        model="gpt-4o-mini",
        timeout_seconds=60.0,
        max_retries=2,
        first_byte_timeout_seconds=20.0,
        stall_timeout_seconds=20.0,
    )
    assert "sk-x" not in repr(defaults)

    custom = OpenAISettings.from_env(
        {
            "OPENAI_API_KEY": "sk-y",
            "OPENAI_BASE_URL": "https://api.deepseek.com/v1",
            "OPENAI_MODEL": "deepseek-reasoner",
            "OPENAI_TIMEOUT_SECONDS": "12.5",
            "OPENAI_MAX_RETRIES": "0",
        }
    )
    assert custom.base_url == "https://api.deepseek.com/v1"
    assert custom.model == "deepseek-reasoner"
    assert custom.timeout_seconds == 12.5
    assert custom.max_retries == 0


@pytest.mark.parametrize("env", [{}, {"OPENAI_API_KEY": "   "}])
def test_missing_api_key_is_a_config_error(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAISettings.from_env(env)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("OPENAI_TIMEOUT_SECONDS", "soon"),
        ("OPENAI_TIMEOUT_SECONDS", "0"),
        ("OPENAI_MAX_RETRIES", "-1"),
    ],
)
def test_bad_numbers_are_config_errors(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        OpenAISettings.from_env({"OPENAI_API_KEY": "sk-x", name: value})


# ------------------------------------- a 200 that is not what was asked for (issue 14)

COMPLETION_BODY: JSON = {
    "id": "chatcmpl-x",
    "object": "chat.completion",
    "created": CREATED,
    "model": "gpt-4o-mini",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "a whole answer"},
            "finish_reason": "stop",
        }
    ],
}


@pytest.mark.parametrize(
    ("reply", "cause"),
    [
        # A provider that ignored stream=true and sent the whole completion as JSON.
        (Reply(body=COMPLETION_BODY), "bad_response"),
        (Reply(raw=b'{"choices": [ {"delta": ', content_type="application/json"), "bad_response"),
        (Reply(raw=b"", content_type="text/event-stream"), "empty_response"),
        (Reply(raw=b"<html>upstream error</html>", content_type="text/html"), "empty_response"),
        (Reply(events=[]), "empty_response"),  # an event stream with no event at all
    ],
    ids=["json-completion", "invalid-json", "empty-body", "html", "no-events"],
)
async def test_http_200_that_is_not_a_stream_is_a_model_error(
    server: FakeChatServer, model: OpenAICompatModel, reply: Reply, cause: str
) -> None:
    server.script(reply)

    with pytest.raises(ModelError) as caught:
        await collect(model, ask())

    assert caught.value.cause == cause
    assert caught.value.attempts == 1
    assert server.base_url in str(caught.value)  # the operator's account names the endpoint
    assert server.base_url not in caught.value.public


async def test_caller_texts_name_no_endpoint_model_or_setting(server: FakeChatServer) -> None:
    server.script(
        Reply(status=401, body={"error": {"message": "Incorrect API key provided: sk-t***"}}),
        Reply(status=503, body={"error": {"message": "busy"}}, headers={"retry-after-ms": "1"}),
        Reply(status=503, body={"error": {"message": "busy"}}, headers={"retry-after-ms": "1"}),
        Reply(stall_seconds=0.3, events=["[DONE]"]),
        Reply(stall_seconds=0.3, events=["[DONE]"]),
    )
    chat = OpenAICompatModel(settings_for(server.base_url, max_retries=1, timeout_seconds=0.2))
    refused = f"http://127.0.0.1:{free_port()}/v1"
    unreachable = OpenAICompatModel(settings_for(refused, max_retries=0))
    errors: list[ModelError] = []
    try:
        for each in (chat, chat, chat, unreachable):
            with pytest.raises(ModelError) as caught:
                await collect(each, ask())
            errors.append(caught.value)
    finally:
        await chat.aclose()
        await unreachable.aclose()

    assert [(e.cause, e.attempts) for e in errors] == [
        ("http_401", 1),
        ("http_503", 2),  # retried once, as OPENAI_MAX_RETRIES says
        ("timeout", 2),
        ("connection", 1),
    ]
    for error in errors:
        for internal in (server.base_url, refused, "127.0.0.1", "gpt-4o-mini", "OPENAI_"):
            assert internal not in error.public, error.public
    assert "OPENAI_API_KEY" in str(errors[0])  # the operator is told what to check


@pytest.mark.parametrize("hang_after", [0, 2], ids=["before-answering", "mid-stream"])
async def test_cancelling_a_hung_call_closes_its_http_request(
    server: FakeChatServer, model: OpenAICompatModel, hang_after: int
) -> None:
    server.script(text_stream("部分", "回答", "永远不会到") if hang_after else Reply())
    server.replies[0].hang_after = hang_after
    seen: list[ModelEvent] = []

    async def consume() -> None:
        async for event in model.stream(ask()):
            seen.append(event)

    call = asyncio.create_task(consume())
    await asyncio.wait_for(server.hanging.wait(), 5)
    await asyncio.sleep(0.1)  # the first events are read
    cancelled = time.monotonic()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    for _ in range(100):
        if server.hung_up:
            break
        await asyncio.sleep(0.01)
    assert server.hung_up, "the HTTP request was left open"
    assert server.hung_up[0] - cancelled < 1.0
    assert seen == ([TextDelta("部分")] if hang_after else [])


async def test_a_hung_endpoint_is_retried_after_the_first_byte_limit_with_progress(
    server: FakeChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No first byte within OPENAI_FIRST_BYTE_TIMEOUT_SECONDS: the attempt ends and the
    next one starts, each told as Waiting (attempt k of n), never minutes of silence."""
    from agentstate.agent_service.model import openai_compat
    from agentstate.agent_service.model.base import Waiting

    monkeypatch.setattr(openai_compat, "PROGRESS_EVERY_SECONDS", 0.1)
    monkeypatch.setattr(openai_compat, "_BACKOFF_SECONDS", 0.01)
    server.script(Reply(hang_after=0), text_stream("终于"))
    chat = OpenAICompatModel(
        settings_for(server.base_url, max_retries=1, first_byte_timeout_seconds=0.4)
    )
    started = time.monotonic()
    try:
        events = await collect(chat, ask())
    finally:
        await chat.aclose()
    assert time.monotonic() - started < 3
    waits = [e for e in events if isinstance(e, Waiting)]
    assert {(w.attempt, w.attempts) for w in waits} >= {(1, 2), (2, 2)}
    assert any("timed out" in w.note for w in waits if w.attempt == 2)
    assert [w.elapsed_seconds for w in waits] == sorted(w.elapsed_seconds for w in waits)
    assert TextDelta("终于") in events and len(server.received) == 2


async def test_a_stall_mid_stream_ends_at_the_stall_limit_and_is_not_retried(
    server: FakeChatServer,
) -> None:
    """Text was already streamed: a retry would say it twice, so the call fails."""
    stalled = text_stream("部分", "回答")
    stalled.hang_after = 2
    server.script(stalled, text_stream("never asked"))
    chat = OpenAICompatModel(
        settings_for(server.base_url, max_retries=2, stall_timeout_seconds=0.4)
    )
    started = time.monotonic()
    events: list[ModelEvent] = []
    try:
        with pytest.raises(ModelError) as caught:
            async for event in chat.stream(ask()):
                events.append(event)
    finally:
        await chat.aclose()
    assert time.monotonic() - started < 3
    assert (caught.value.cause, caught.value.attempts) == ("timeout", 1)
    assert "OPENAI_STALL_TIMEOUT_SECONDS" in str(caught.value)
    assert TextDelta("部分") in events and len(server.received) == 1


def test_wait_limits_come_from_the_environment() -> None:
    custom = OpenAISettings.from_env(
        {
            "OPENAI_API_KEY": "sk-z",
            "OPENAI_FIRST_BYTE_TIMEOUT_SECONDS": "7.5",
            "OPENAI_STALL_TIMEOUT_SECONDS": "3",
        }
    )
    assert (custom.first_byte_timeout_seconds, custom.stall_timeout_seconds) == (7.5, 3.0)
    with pytest.raises(ConfigError, match="OPENAI_STALL_TIMEOUT_SECONDS"):
        OpenAISettings.from_env({"OPENAI_API_KEY": "sk-z", "OPENAI_STALL_TIMEOUT_SECONDS": "0"})
