"""A real OpenAI-compatible endpoint misbehaving under a running agent (issue 14).

The agent talks to a local HTTP server over real HTTP with the real SDK: answers that
are not a stream, an endpoint that hangs before answering or stalls mid-stream. A
failed turn must be an error that changes nothing it did not finish, and Stop,
shutdown or a lost lease must end the model call at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import psycopg
import pytest

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent_service.model.openai_compat import OpenAICompatModel
from agentstate.state.v1 import state_service_pb2 as spb
from tests.agent_service.test_openai_compat import (
    API_KEY,
    COMPLETION_BODY,
    FakeChatServer,
    Reply,
    chunk,
    settings_for,
    text_stream,
    tool_call_args,
    tool_call_start,
)
from tests.support.agent_harness import AgentClient, Stack, collect, metadata

QUESTION = "我的订单88235现在什么状态？"


@pytest.fixture
async def agent(stack: Stack, server: FakeChatServer) -> AsyncIterator[AgentClient]:
    # Retries on, as in production: a Stop must not wait for them either.
    model = OpenAICompatModel(settings_for(server.base_url, max_retries=2, timeout_seconds=60))
    yield await stack.start_agent(model=model)
    await model.aclose()


def _query_order_call() -> Reply:
    return Reply(
        events=[
            chunk({"role": "assistant", "content": None}),
            chunk(tool_call_start(0, "call_q1", "query_order")),
            chunk(tool_call_args(0, '{"limit": 5}')),
            chunk({}, "tool_calls"),
            "[DONE]",
        ]
    )


def _user_texts(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["role"], m.get("content") or "") for m in body["messages"] if m["role"] != "system"]


@pytest.mark.parametrize(
    "reply",
    [
        Reply(body=COMPLETION_BODY),
        Reply(raw=b"{not json", content_type="application/json"),
        Reply(raw=b"", content_type="text/event-stream"),
    ],
    ids=["json-instead-of-stream", "invalid-json", "empty-body"],
)
async def test_a_200_that_is_not_a_stream_fails_the_turn_and_changes_nothing(
    stack: Stack,
    server: FakeChatServer,
    agent: AgentClient,
    user_id: str,
    reply: Reply,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server.script(text_stream("你好，有什么可以帮你？"))
    first = await agent.chat(user_id, "你好")
    conversation_id = first.meta.conversation_id
    before, version = await stack.reader.state(user_id, conversation_id)

    server.script(reply)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        turn = await agent.chat(user_id, QUESTION, conversation_id)

    # An error, not an empty answer: the event, the status, the record, the log line.
    assert turn.code == grpc.StatusCode.UNAVAILABLE, turn.details
    assert turn.kinds()[-1] == "message"
    assert turn.of("message")[-1].type == pb.MESSAGE_TYPE_ERROR
    shown = turn.of("message")[-1].delta
    assert shown == "模型返回的内容无法识别，这一轮没有完成，请重试。"
    for internal in (server.base_url, "gpt-4o-mini", "OPENAI_"):
        assert internal not in turn.details and internal not in shown
    assert turn.error_info.reason == "MODEL_FAILED"
    assert turn.error_info.metadata["cause"] in ("bad_response", "empty_response")
    assert server.base_url in turn.error_info.metadata["detail"]
    records = await stack.reader.records(user_id, conversation_id)
    assert [r.status for r in records[-2:]] == [
        spb.MESSAGE_STATUS_NORMAL,  # the question, as the user asked it
        spb.MESSAGE_STATUS_ERROR,
    ]
    assert json.loads(records[-1].metadata_json) == {"error": shown}
    after, version_after = await stack.reader.state(user_id, conversation_id)
    assert (version_after, after.to_json()) == (version, before.to_json())
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    line = warnings[0]
    assert (line.conversation_id, line.task_id) == (conversation_id, turn.meta.task_id)  # type: ignore[attr-defined]
    assert line.cause in ("bad_response", "empty_response")  # type: ignore[attr-defined]
    assert line.attempts == 1  # type: ignore[attr-defined]
    logged = line.getMessage() + json.dumps(line.__dict__, default=str, ensure_ascii=False)
    assert API_KEY not in logged and QUESTION not in logged

    # Asking again: the model reads the question once, after the earlier answer.
    server.script(text_stream("订单88235已支付待发货。"))
    again = await agent.chat(user_id, QUESTION, conversation_id)
    assert again.code == grpc.StatusCode.OK, again.details
    assert _user_texts(server.received[-1].body) == [
        ("user", "你好"),
        ("assistant", "你好，有什么可以帮你？"),
        ("user", QUESTION),
    ]


async def test_a_failure_after_a_finished_step_keeps_it_and_what_was_streamed(
    stack: Stack, server: FakeChatServer, agent: AgentClient, user_id: str
) -> None:
    # The tool cycle finishes; the answer then breaks off after some text.
    server.script(
        _query_order_call(),
        Reply(
            events=[
                chunk({"role": "assistant", "content": "订单88235"}),
                json.dumps({"error": {"message": "upstream overloaded", "type": "server_error"}}),
            ]
        ),
    )
    turn = await agent.chat(user_id, QUESTION)
    assert turn.code == grpc.StatusCode.UNAVAILABLE, turn.details
    conversation_id = turn.meta.conversation_id
    state, _ = await stack.reader.state(user_id, conversation_id)
    assert [(m.role.value, [b.to_json()["type"] for b in m.content]) for m in state.context] == [
        ("USER", ["text"]),
        ("ASSISTANT", ["tool_use"]),
        ("TOOL", ["tool_result"]),
    ]
    [record] = (await stack.reader.records(user_id, conversation_id))[-1:]
    blocks = json.loads(record.blocks_json)
    assert [b["type"] for b in blocks] == ["tool_use", "tool_result", "text"]
    assert blocks[0]["outcome"] == "finished" and blocks[0]["state"] == "allowed"
    assert blocks[2]["text"] == "订单88235"  # what the user saw stays visible
    assert json.loads(record.metadata_json)["error"] == turn.of("message")[-1].delta

    server.script(text_stream("好的"))
    again = await agent.chat(user_id, QUESTION, conversation_id)
    assert again.code == grpc.StatusCode.OK, again.details
    roles = [role for role, _ in _user_texts(server.received[-1].body)]
    assert roles == ["user", "assistant", "tool", "user"]


async def _start_hanging_turn(
    agent: AgentClient, server: FakeChatServer, user_id: str, *, hang_after: int
) -> tuple[Any, pb.MetaEvent]:
    hung = text_stream("部分", "回答", "never sent") if hang_after else Reply()
    hung.hang_after = hang_after
    server.script(_query_order_call(), hung)
    call = agent.stub.Chat(pb.ChatRequest(question=QUESTION), metadata=metadata(user_id))
    meta = (await call.read()).event.meta
    await asyncio.wait_for(server.hanging.wait(), 10)
    await asyncio.sleep(0.2)  # the endpoint has been silent for a while
    return call, meta


async def _ended_within(call: Any, started: float, server: FakeChatServer) -> float:
    turn = await collect(call)
    took = time.monotonic() - started
    assert turn.code == grpc.StatusCode.OK, turn.details
    assert turn.kinds()[-2:] == ["cancel", "done"]
    assert server.hung_up and server.hung_up[0] - started < 1.0, "the HTTP request was left open"
    return took


@pytest.mark.parametrize("hang_after", [0, 2], ids=["hangs-before-answering", "stalls-mid-stream"])
async def test_stop_cancels_a_hung_model_call_and_keeps_what_finished(
    stack: Stack, server: FakeChatServer, agent: AgentClient, user_id: str, hang_after: int
) -> None:
    call, meta = await _start_hanging_turn(agent, server, user_id, hang_after=hang_after)

    started = time.monotonic()
    await agent.stub.Stop(pb.StopRequest(task_id=meta.task_id), metadata=metadata(user_id))
    took = await _ended_within(call, started, server)
    assert took < 1.0, f"the turn ended {took:.2f}s after Stop"

    state, _ = await stack.reader.state(user_id, meta.conversation_id)
    assert state.context[-1].content[0].to_json()["type"] == "tool_result"  # the cycle kept
    record = (await stack.reader.records(user_id, meta.conversation_id))[-1]
    assert record.status == spb.MESSAGE_STATUS_INTERRUPTED
    blocks = json.loads(record.blocks_json)
    assert blocks[0]["outcome"] == "finished"
    assert [b.get("text") for b in blocks if b["type"] == "text"] == (
        ["部分"] if hang_after else []
    )
    server.script(text_stream("好的"))  # the conversation is free again
    again = await agent.chat(user_id, "那就这样吧", meta.conversation_id)
    assert again.code == grpc.StatusCode.OK, again.details


async def test_a_lost_lease_cancels_a_hung_model_call(
    stack: Stack, server: FakeChatServer, agent: AgentClient, user_id: str, database_url: str
) -> None:
    call, meta = await _start_hanging_turn(agent, server, user_id, hang_after=0)
    started = time.monotonic()
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("DELETE FROM t_run_lease WHERE task_id = %s", (int(meta.task_id),))
    renew = stack.agent_settings.lease_renew_seconds
    took = await collect(call), time.monotonic() - started
    assert took[0].of("cancel")[0].reason == "the run lease was lost"
    # Noticed at the next heartbeat, then cancelled at once.
    assert took[1] < renew + 1.0, f"{took[1]:.2f}s"
    assert server.hung_up and server.hung_up[0] - started < renew + 1.0


async def test_shutdown_cancels_a_hung_model_call(
    stack: Stack, server: FakeChatServer, user_id: str
) -> None:
    model = OpenAICompatModel(settings_for(server.base_url, max_retries=2, timeout_seconds=60))
    agent = await stack.start_agent(model=model, shutdown_grace_seconds=0.2)
    call, meta = await _start_hanging_turn(agent, server, user_id, hang_after=2)
    app = next(app for app, client in stack.agents if client is agent)
    stack.agents.remove((app, agent))
    started = time.monotonic()
    stopping = asyncio.create_task(app.stop())  # as SIGTERM does
    turn = await collect(call)
    await stopping
    await agent.close()
    await model.aclose()
    assert turn.of("cancel")[0].reason == "the service is shutting down"
    assert server.hung_up and server.hung_up[0] - started < 0.2 + 1.0
    state, _ = await stack.reader.state(user_id, meta.conversation_id)
    assert state.shutdown_interrupted


async def test_the_same_question_after_a_stopped_turn_is_read_once(
    stack: Stack, server: FakeChatServer, agent: AgentClient, user_id: str
) -> None:
    server.script(Reply(hang_after=0))
    call = agent.stub.Chat(pb.ChatRequest(question=QUESTION), metadata=metadata(user_id))
    meta = (await call.read()).event.meta
    await asyncio.wait_for(server.hanging.wait(), 10)
    await agent.stub.Stop(pb.StopRequest(task_id=meta.task_id), metadata=metadata(user_id))
    assert (await collect(call)).kinds()[-2:] == ["cancel", "done"]
    state, _ = await stack.reader.state(user_id, meta.conversation_id)
    assert state.context[-1].text == QUESTION  # kept: the user may go on from it

    server.script(text_stream("订单88235已支付待发货。"))
    again = await agent.chat(user_id, QUESTION, meta.conversation_id)
    assert again.code == grpc.StatusCode.OK, again.details
    assert _user_texts(server.received[-1].body) == [("user", QUESTION)]
    state, _ = await stack.reader.state(user_id, meta.conversation_id)
    assert [m.text for m in state.context] == [QUESTION, "订单88235已支付待发货。"]


async def test_a_hung_model_is_told_as_progress_and_ends_within_the_first_byte_limits(
    stack: Stack, server: FakeChatServer, user_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The endpoint never answers: the client gets progress events (attempt k of n,
    time elapsed) while it waits, and the turn fails after (first-byte limit x attempts),
    not after minutes; the failure is the model's, in its own words."""
    from agentstate.agent_service.model import openai_compat

    monkeypatch.setattr(openai_compat, "PROGRESS_EVERY_SECONDS", 0.2)
    monkeypatch.setattr(openai_compat, "_BACKOFF_SECONDS", 0.01)
    model = OpenAICompatModel(
        settings_for(
            server.base_url, max_retries=1, timeout_seconds=60, first_byte_timeout_seconds=0.6
        )
    )
    agent = await stack.start_agent(model=model)
    try:
        server.script(Reply(hang_after=0), Reply(hang_after=0))
        started = time.monotonic()
        turn = await agent.chat(user_id, QUESTION)
        took = time.monotonic() - started
    finally:
        await model.aclose()
    assert took < 4, f"the user waited {took:.1f}s"
    progress = turn.of("progress")
    assert {(p.attempt, p.attempts) for p in progress} == {(1, 2), (2, 2)}
    assert [p.elapsed_ms for p in progress] == sorted(p.elapsed_ms for p in progress)
    assert any("timed out" in p.note for p in progress)
    assert turn.kinds()[0] == "meta" and turn.kinds()[-1] == "message"
    assert turn.code == grpc.StatusCode.UNAVAILABLE
    assert turn.error_info.reason == "MODEL_FAILED"
    assert (turn.error_info.metadata["cause"], turn.error_info.metadata["attempts"]) == (
        "timeout",
        "2",
    )
    assert turn.of("message")[-1].delta == "模型响应超时，这一轮没有完成，请稍后重试。"
    assert len(server.received) == 2
