"""The OpenAI Agents SDK's own loop with a fake model (no network), for the tests and the
worker processes they start (tests/support/framework_workers.py)."""

from __future__ import annotations

import os
import sys
from typing import Any

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # no exporter, no network

from agents import Agent, Runner, set_tracing_disabled
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import ModelResponse, TResponseInputItem
from agents.model_settings import ModelSettings
from agents.models.interface import Model, ModelTracing
from agents.run import RunConfig
from agents.tool import Tool
from agents.usage import Usage
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

from agentstate.client.aio import AsyncStateClient
from agentstate.integrations.openai_agents import AgentStateSession

set_tracing_disabled(True)


def _text_of(item: Any) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [])


class RecallModel(Model):
    """Answers with how many user turns it was given and what the first one asked: the
    answer shows whether the session gave the model the whole history."""

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        items: list[Any] = [{"role": "user", "content": input}] if isinstance(input, str) else input
        users = [i for i in items if isinstance(i, dict) and i.get("role") == "user"]
        text = f"turn {len(users)}; first question: {_text_of(users[0])}"
        message = ResponseOutputMessage(
            id=f"msg_{len(users)}",
            type="message",
            role="assistant",
            status="completed",
            content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> Any:
        raise NotImplementedError("the tests do not stream")


async def openai_add(address: str, user: str, session_id: str, count: int, tag: str) -> Any:
    """Add `count` items, one add_items call each, once stdin says go (so that two
    workers' first access and appends overlap)."""
    async with AsyncStateClient.connect(address) as client:
        session = AgentStateSession(session_id, client=client, user_id=user)
        print("ready", flush=True)
        sys.stdin.readline()
        for n in range(count):
            await session.add_items([{"role": "user", "content": f"{tag}-{n}"}])
    return {"added": count}


async def openai_turn(address: str, user: str, session_id: str, question: str) -> Any:
    async with AsyncStateClient.connect(address) as client:
        session = AgentStateSession(session_id, client=client, user_id=user)
        agent = Agent(name="assistant", instructions="Answer briefly.", model=RecallModel())
        result = await Runner.run(
            agent, question, session=session, run_config=RunConfig(tracing_disabled=True)
        )
        return {"output": result.final_output}
