"""Failure paths of a turn: the model, a tool, bad calls, the state service, the lease."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import psycopg
import pytest

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent_service.agent_state import ToolResultBlock
from agentstate.agent_service.model.base import ModelError, ModelEvent, ModelRequest, ToolSpec
from agentstate.agent_service.tools.registry import Tool, ToolContext, ToolOutput
from agentstate.examples.order_demo.orders.base import OrderStatus
from agentstate.state.v1 import state_service_pb2 as spb
from tests.support.agent_harness import RecordingModel, Stack, collect, metadata

STATUS = "我的订单88235现在什么状态？"


def _results(state: Any) -> list[ToolResultBlock]:
    return [b for m in state.context for b in m.content if isinstance(b, ToolResultBlock)]


class FailingModel(RecordingModel):
    """The scripted model, failing from its `fail_from`-th call on."""

    def __init__(self, fail_from: int) -> None:
        super().__init__()
        self.fail_from = fail_from

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if len(self.requests) + 1 >= self.fail_from:
            self.requests.append(request)
            raise ModelError(
                "model endpoint http://10.0.0.7/v1 returned HTTP 503 (check OPENAI_BASE_URL)",
                public="the model endpoint returned HTTP 503",
                cause="http_503",
                attempts=3,
            )
        async for event in super().stream(request):
            yield event


async def test_model_failure_keeps_what_the_turn_completed(stack: Stack, user_id: str) -> None:
    client = await stack.start_agent(model=FailingModel(fail_from=2))
    turn = await client.chat(user_id, STATUS)
    assert turn.code == grpc.StatusCode.UNAVAILABLE
    # What happened, without the endpoint or setting names: those are for operators.
    assert turn.details == "the model failed: the model endpoint returned HTTP 503"
    info = turn.error_info
    assert info is not None and info.reason == "MODEL_FAILED"
    assert info.metadata["cause"] == "http_503" and info.metadata["attempts"] == "3"
    assert "http://10.0.0.7/v1" in info.metadata["detail"]
    assert [(b.tool_name, b.status) for b in turn.of("block")][-1] == (
        "query_order",
        pb.TOOL_CALL_STATUS_SUCCEEDED,
    )
    assert turn.of("message")[-1].type == pb.MESSAGE_TYPE_ERROR
    assert turn.of("message")[-1].delta == "模型服务出错，这一轮没有完成，请稍后重试。"
    state, version = await stack.reader.state(user_id, turn.meta.conversation_id)
    assert version == 1  # the finished tool cycle was saved, not lost
    assert [r.name for r in _results(state)] == ["query_order"]
    records = await stack.reader.records(user_id, turn.meta.conversation_id)
    assert records[-1].status == spb.MESSAGE_STATUS_ERROR
    # The page shows why, and the call that did run, settled.
    assert json.loads(records[-1].metadata_json)["error"] == turn.of("message")[-1].delta
    [call] = [b for b in json.loads(records[-1].blocks_json) if b["type"] == "tool_use"]
    assert (call["name"], call["outcome"]) == ("query_order", "finished")


async def test_tool_errors_and_bad_calls_reach_the_model_not_the_user(
    stack: Stack, user_id: str
) -> None:
    async def explode(args: dict[str, Any], context: ToolContext) -> ToolOutput:
        raise RuntimeError("disk on fire")

    client = await stack.start_agent(
        extra_tools=[Tool(ToolSpec("explode", "fails", {"type": "object"}), explode)]
    )
    cases = [
        ("/explode {}", "explode", "工具出错：disk on fire"),
        ('/query_order {"limit": 99}', "query_order", "参数 limit 不能大于 20，收到 99"),
        ('/query_order {"limit": "five"}', "query_order", "参数 limit 应为整数"),
        ("/no_such_tool {}", "no_such_tool", "没有名为 no_such_tool 的工具"),
        # A confirmation tool whose handbook is not loaded: refused, and no card is shown.
        ('/cancel_order {"orderNo": "88235"}', "cancel_order", "现在不可用"),
        # ... and one with arguments that could never run.
        ('/cancel_order {"order": "88235"}', "cancel_order", "缺少必填参数 orderNo"),
    ]
    conversation_id = ""
    for question, tool, message in cases:
        if question.startswith('/cancel_order {"order"'):  # the handbook first, this time
            loaded = await client.chat(
                user_id, '/load_skill {"name": "order-change"}', conversation_id
            )
            assert loaded.of("block")[-1].status == pb.TOOL_CALL_STATUS_SUCCEEDED
        turn = await client.chat(user_id, question, conversation_id)
        conversation_id = turn.meta.conversation_id
        assert turn.code == grpc.StatusCode.OK, turn.details
        assert "confirm" not in turn.kinds()
        failed = turn.of("block")[-1]
        assert (failed.tool_name, failed.status) == (tool, pb.TOOL_CALL_STATUS_FAILED)
        assert message in failed.summary, failed.summary
        assert turn.kinds()[-2:] == ["finish", "done"]
    state, _ = await stack.reader.state(user_id, conversation_id)
    outcomes = [(r.name, r.state.value) for r in _results(state)]
    assert outcomes.count(("load_skill", "success")) == 1
    assert [o for o in outcomes if o[0] != "load_skill"] == [(t, "error") for _, t, _ in cases]
    order = await stack.orders.get_order(user_id, "88235")
    assert order is None or order.status is OrderStatus.PAID_AWAITING_SHIPMENT


async def test_state_service_lost_before_the_save(
    stack: Stack, user_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agentstate.agent_service.runtime.persistence")
    fast = stack.agents[0][1]
    first = await fast.chat(user_id, STATUS)
    conversation_id = first.meta.conversation_id
    before, version = await stack.reader.state(user_id, conversation_id)
    slow = await stack.start_agent(model=RecordingModel(delay=1.0))
    call = slow.stub.Chat(
        pb.ChatRequest(conversation_id=conversation_id, question="那88240呢？"),
        metadata=metadata(user_id),
    )
    assert (await call.read()).event.HasField("meta")
    await stack.stop_state()
    turn = await collect(call)
    assert turn.code == grpc.StatusCode.UNAVAILABLE, turn.details
    assert turn.of("message")[-1].type == pb.MESSAGE_TYPE_ERROR
    # The reply record could not be marked ERROR either (the state service is gone): said.
    [unmarked] = [r for r in caplog.records if "could not be marked ERROR" in r.getMessage()]
    assert unmarked.levelno == logging.WARNING
    assert getattr(unmarked, "conversation_id", None) == conversation_id
    assert "Unavailable" in unmarked.getMessage()
    await stack.start_state()
    after, version_after = await stack.reader.state(user_id, conversation_id)
    assert version_after == version and after.to_json() == before.to_json()


async def test_lost_lease_stops_the_turn(stack: Stack, user_id: str, database_url: str) -> None:
    slow = await stack.start_agent(model=RecordingModel(delay=1.0))
    call = slow.stub.Chat(pb.ChatRequest(question=STATUS), metadata=metadata(user_id))
    meta = (await call.read()).event.meta
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("DELETE FROM t_run_lease WHERE task_id = %s", (int(meta.task_id),))
    turn = await collect(call)
    assert turn.code == grpc.StatusCode.OK, turn.details
    assert turn.kinds()[-2:] == ["cancel", "done"]
    assert turn.of("cancel")[0].reason == "the run lease was lost"
    records = await stack.reader.records(user_id, meta.conversation_id)
    assert records[-1].status == spb.MESSAGE_STATUS_INTERRUPTED
