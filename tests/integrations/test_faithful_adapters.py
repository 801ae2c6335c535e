"""Faithful payloads through each adapter (issue 22, item 1), against the framework's
own reference backend, over real gRPC to a state service process on real PostgreSQL:
the values that JSONB used to change (U+0000, 1e21, -0.0, integers above 2**53, key
order, non-BMP characters, NaN and the infinities) come back as the reference backend
gives them. Compared as JSON text without sorting keys (json.dumps, which writes NaN),
so 1 and 1.0, -0.0 and 0.0, and two key orders all differ.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agents import Agent, Runner, SQLiteSession, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.run import RunConfig
from agents.usage import Usage
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions import InMemorySessionService
from google.adk.sessions.base_session_service import BaseSessionService
from google.genai import types
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from agentstate.client.aio import AsyncStateClient
from agentstate.integrations.adk import AgentStateSessionService
from agentstate.integrations.langgraph import AgentStateSaver
from agentstate.integrations.openai_agents import AgentStateSession

set_tracing_disabled(True)  # no exporter, no network


def hard_values() -> dict[str, Any]:
    """Every value kind that JSONB changed, in an order that is not sorted."""
    return {
        "z_nul": "tool output \x00 with NUL",
        "float_big": 1e21,
        "neg_zero": -0.0,
        "above_2_53": 2**53 + 1,
        "one": 1,
        "one_float": 1.0,
        "emoji": "😀 \U0001f9d1\u200d\U0001f4bb",
        "nan": float("nan"),
        "inf": float("inf"),
        "nested": {"b": [1e21, -0.0, {"y": 1, "x": 2}], "a": None},
        "a_last": True,
    }


def text(value: Any) -> str:
    return json.dumps(value)


@pytest.fixture
async def client(state_process_address: str) -> AsyncIterator[AsyncStateClient]:
    async with AsyncStateClient.connect(state_process_address) as connected:
        yield connected


async def test_openai_items_as_sqlite_session(client: AsyncStateClient, user_id: str) -> None:
    ours: Any = AgentStateSession(f"faithful-{uuid.uuid4()}", client=client, user_id=user_id)
    theirs = SQLiteSession("faithful")
    items: list[Any] = [
        {"role": "user", "content": "a\x00b"},
        {"type": "function_call_output", "call_id": "c1", "output": text(hard_values())},
        {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}], **hard_values()},
    ]
    for session in (ours, theirs):
        await session.add_items(items)
    assert text(await ours.get_items()) == text(await theirs.get_items())
    assert text(await ours.get_items(limit=1)) == text(await theirs.get_items(limit=1))
    assert text(await ours.pop_item()) == text(await theirs.pop_item())
    assert text(await ours.get_items()) == text(await theirs.get_items())
    theirs.close()


def _event(n: int, delta: dict[str, Any]) -> Event:
    return Event(
        id=f"ev-{n}",
        invocation_id="inv-1",
        author="user",
        timestamp=1_700_000_000.0 + n,
        content=types.Content(role="user", parts=[types.Part(text=f"m\x00{n}")]),
        actions=EventActions(state_delta=delta),
    )


async def _adk_view(service: BaseSessionService, app: str, user: str) -> list[str]:
    seen: list[str] = []
    hard = hard_values()
    session = await service.create_session(
        app_name=app,
        user_id=user,
        session_id="s1",
        state={**hard, "app:big": 1e21, "user:nul": "\x00"},
    )
    seen.append(text(session.state))
    await service.append_event(
        session,
        _event(1, {"nested": {"c": -0.0}, "new": 1e21, "user:neg": -0.0, "nan2": float("nan")}),
    )
    await service.append_event(session, _event(2, {"float_big": 2.5, "app:n": 2**53 + 1}))
    got = await service.get_session(app_name=app, user_id=user, session_id="s1")
    assert got is not None
    seen.append(text(got.state))
    # The events as the caller reads them: content (with its NUL) and each state_delta.
    seen.append(text([e.actions.state_delta for e in got.events]))
    seen.append(text([e.content.model_dump(exclude_none=True) for e in got.events if e.content]))
    seen.append(text(await service.get_user_state(app_name=app, user_id=user)))
    return seen


async def test_adk_state_and_events_as_in_memory_service(
    client: AsyncStateClient, user_id: str
) -> None:
    app = f"faithful-{uuid.uuid4()}"
    ours = await _adk_view(AgentStateSessionService(client=client), app, user_id)
    theirs = await _adk_view(InMemorySessionService(), app, user_id)
    # The one deliberate difference: an event is stored as ADK's own pydantic JSON
    # (model_dump_json), which writes NaN as null; the session state keeps NaN.
    assert '"nan2": NaN' in theirs[2] and '"nan2": NaN' in ours[1]
    theirs[2] = theirs[2].replace('"nan2": NaN', '"nan2": null')
    assert ours == theirs


async def test_langgraph_metadata_and_values_as_in_memory_saver(
    state_process_address: str,
) -> None:
    thread = f"faithful-{uuid.uuid4()}"
    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    ours = AgentStateSaver(state_process_address)
    theirs = InMemorySaver()
    hard = hard_values()
    seen: list[list[str]] = []
    for saver in (ours, theirs):
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"values": hard}
        checkpoint["channel_versions"] = {"values": "1"}
        metadata_in: Any = {"source": "input", "step": -1, **hard}
        stored = await saver.aput(config, checkpoint, metadata_in, {"values": "1"})
        await saver.aput_writes(stored, [("values", {"w": hard})], "task-1")
        got = await saver.aget_tuple(stored)
        assert got is not None
        metadata = {k: v for k, v in got.metadata.items() if k in {"source", "step", *hard}}
        seen.append(
            [
                text(metadata),
                text(got.checkpoint["channel_values"]),
                text([list(w) for w in got.pending_writes or []]),
            ]
        )
    await ours.aclose()
    assert seen[0] == seen[1]


class _CallThenAnswer(Model):
    """Calls the tool `leak` once, then answers with the tool's output (NULs included)."""

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items: list[Any] = [] if isinstance(input, str) else list(input)
        outputs = [
            i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"
        ]
        if not outputs or items[-1].get("type") != "function_call_output":
            call = ResponseFunctionToolCall(
                type="function_call", call_id=f"call-{len(items)}", name="leak", arguments="{}",
                id=f"fc-{len(items)}", status="completed",
            )  # fmt: skip
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        message = ResponseOutputMessage(
            id=f"msg-{len(items)}", type="message", role="assistant", status="completed",
            content=[ResponseOutputText(
                type="output_text", text=str(outputs[-1]["output"]), annotations=[])],
        )  # fmt: skip
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


async def test_openai_runner_with_a_nul_tool_output(client: AsyncStateClient, user_id: str) -> None:
    """The issue's report: a tool output with one NUL made Runner.run raise and the session
    kept only the user's message. Now the turn completes and the session holds what
    SQLiteSession holds."""

    @function_tool
    def leak() -> str:
        """Returns text with NUL characters."""
        return "stock\x00 restored \x00 😀"

    agent = Agent(name="a", instructions="x", model=_CallThenAnswer(), tools=[leak])
    ours: Any = AgentStateSession(f"runner-{uuid.uuid4()}", client=client, user_id=user_id)
    theirs = SQLiteSession("runner")
    results = []
    for session in (ours, theirs):
        for question in ("run it", "again"):
            result = await Runner.run(
                agent, question, session=session, run_config=RunConfig(tracing_disabled=True)
            )
            results.append(result.final_output)
    assert results[0] == "stock\x00 restored \x00 😀" and results[:2] == results[2:]
    assert text(await ours.get_items()) == text(await theirs.get_items())
    theirs.close()
