"""A running turn's events on its reply record, for a page that attaches mid-turn on any
replica (agent_service/runtime/live.py), and its timeline once saved
(agent_service/runtime/timeline.py). Real agent, real state service, real PostgreSQL."""

from __future__ import annotations

import asyncio
import json

import grpc

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.examples.order_demo.model import ScriptedOrderModel
from agentstate.state.v1 import state_service_pb2 as spb
from tests.support.agent_harness import Stack, collect, metadata

QUESTION = "我的订单88235现在什么状态？"


async def test_a_running_turn_journals_its_events_and_its_record_ends_with_a_timeline(
    stack: Stack, user_id: str
) -> None:
    agent = await stack.start_agent(model=ScriptedOrderModel(step_delay_seconds=0.8))
    call = agent.stub.Chat(pb.ChatRequest(question=QUESTION), metadata=metadata(user_id))
    meta = (await call.read()).event.meta
    journal: list[dict[str, object]] = []
    seen_task = ""
    for _ in range(60):  # until the first step (its text and tool call) is journaled
        await asyncio.sleep(0.1)
        record = (await stack.reader.records(user_id, meta.conversation_id))[-1]
        assert record.status == spb.MESSAGE_STATUS_STREAMING
        live = json.loads(record.metadata_json or b"{}").get("live", {})
        seen_task = live.get("task_id", seen_task)
        journal = live.get("events", [])
        if any(e.get("type") == "block" for e in journal):
            break
    assert seen_task == meta.task_id  # a page that attaches can Stop the turn
    assert journal[0] == {"type": "message", "kind": "thinking", "delta": "先查最近5笔订单。"}
    block = next(e for e in journal if e["type"] == "block")
    assert (block["tool_name"], block["arguments"]) == ("query_order", {"limit": 5})
    assert block["status"] in ("running", "succeeded")
    turn = await collect(call)
    assert turn.code == grpc.StatusCode.OK, turn.details
    # The saved record: no journal any more, the timeline instead.
    records = await stack.reader.records(user_id, meta.conversation_id)
    saved = json.loads(records[-1].metadata_json)
    assert records[-1].status == spb.MESSAGE_STATUS_NORMAL and "live" not in saved
    timeline = saved["timeline"]
    kinds = [e["kind"] for e in timeline["events"]]
    assert kinds == ["begin", "model", "tool", "model", "save"], kinds
    begin, first_model, tool, _, save = timeline["events"]
    assert begin["task_id"] == meta.task_id and begin["version"] == 0
    assert first_model["ms"] >= 800 and first_model["tool_calls"] == ["query_order"]
    assert first_model["tokens"]["output_tokens"] > 0
    assert tool["input"] == {"limit": 5} and tool["outcome"] == "succeeded"
    assert "88235" in tool["output"] or "88240" in tool["output"]
    assert (save["expected_version"], save["mode"]) == (0, "whole")
    assert [e["at_ms"] for e in timeline["events"]] == sorted(
        e["at_ms"] for e in timeline["events"]
    )
    assert timeline["total_ms"] >= save["at_ms"]


async def test_a_quick_turn_costs_no_journal_write(stack: Stack, user_id: str) -> None:
    """Most turns end before the journal's first write: BeginTurn and EndTurn only."""
    agent = await stack.start_agent()
    turn = await agent.chat(user_id, QUESTION)
    assert turn.code == grpc.StatusCode.OK, turn.details
    records = await stack.reader.records(user_id, turn.meta.conversation_id)
    assert "live" not in json.loads(records[-1].metadata_json)


async def test_a_journal_write_after_the_save_changes_nothing(stack: Stack, user_id: str) -> None:
    """The journal writes only while the record is STREAMING: one that arrives late
    (after EndTurn) leaves the saved record exactly as it is."""
    from agentstate.agent_service.client_state_port import ClientStatePort
    from agentstate.agent_service.events import Hint
    from agentstate.agent_service.runtime import live
    from agentstate.client import AsyncStateClient

    agent = await stack.start_agent()
    turn = await agent.chat(user_id, QUESTION)
    before = await stack.reader.records(user_id, turn.meta.conversation_id)
    async with AsyncStateClient.connect(stack.state_address) as client:
        journal = live.LiveJournal(
            ClientStatePort(client),
            user_id,
            turn.meta.conversation_id,
            before[-1].message_id,
            turn.meta.task_id,
            flush_seconds=0.01,
        )
        journal.start()
        journal.add(Hint("late"))
        await asyncio.sleep(live.FIRST_FLUSH_SECONDS + 0.3)
        await journal.close()
    after = await stack.reader.records(user_id, turn.meta.conversation_id)
    assert after == before
