"""Fake models for the agent frameworks' own loops (no network), and the worker processes
the framework tests start: `python -m tests.framework_fakes COMMAND ARGS...` prints one
JSON line.

  openai-add ADDRESS USER SESSION COUNT TAG   add COUNT items, one add_items call each
  openai-turn ADDRESS USER SESSION QUESTION   one Runner.run turn on the session
  adk-turn ADDRESS USER SESSION QUESTION      one ADK Runner turn (app "shop")
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from typing import Any

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # no exporter, no network

from agents import Agent, Runner, set_tracing_disabled
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.model_settings import ModelSettings
from agents.models.interface import Model, ModelTracing
from agents.run import RunConfig
from agents.tool import Tool
from agents.usage import Usage
from google.adk.agents.llm_agent import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner as AdkRunner
from google.genai import types
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

from agentstate.client.aio import AsyncStateClient
from agentstate.integrations.adk import AgentStateSessionService
from agentstate.integrations.openai_agents import AgentStateSession

set_tracing_disabled(True)

ADK_APP = "shop"


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
    ) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("the tests do not stream")


class RecallLlm(BaseLlm):
    """ADK's model interface: replies with how many user turns the request holds and the
    first one's text."""

    model: str = "recall"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        users = [c for c in llm_request.contents if c.role == "user"]
        first = "".join(p.text or "" for p in (users[0].parts or [])) if users else ""
        text = f"turn {len(users)}; first question: {first}"
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))


def openai_agent() -> Agent[Any]:
    return Agent(name="assistant", instructions="Answer briefly.", model=RecallModel())


def adk_agent() -> LlmAgent:
    # output_key: each reply lands in the session state as "last_reply".
    return LlmAgent(name="assistant", model=RecallLlm(), output_key="last_reply")


async def openai_add(address: str, user: str, session_id: str, count: int, tag: str) -> Any:
    async with AsyncStateClient.connect(address) as client:
        session = AgentStateSession(session_id, client=client, user_id=user)
        for n in range(count):
            await session.add_items([{"role": "user", "content": f"{tag}-{n}"}])
    return {"added": count}


async def openai_turn(address: str, user: str, session_id: str, question: str) -> Any:
    async with AsyncStateClient.connect(address) as client:
        session = AgentStateSession(session_id, client=client, user_id=user)
        result = await Runner.run(
            openai_agent(), question, session=session, run_config=RunConfig(tracing_disabled=True)
        )
        return {"output": result.final_output}


async def adk_turn(address: str, user: str, session_id: str, question: str) -> Any:
    async with AsyncStateClient.connect(address) as client:
        service = AgentStateSessionService(client)
        runner = AdkRunner(agent=adk_agent(), app_name=ADK_APP, session_service=service)
        if await service.get_session(app_name=ADK_APP, user_id=user, session_id=session_id) is None:
            await service.create_session(
                app_name=ADK_APP,
                user_id=user,
                session_id=session_id,
                state={"user:turns": 0, "topic": "orders"},
            )
        session = await service.get_session(app_name=ADK_APP, user_id=user, session_id=session_id)
        assert session is not None
        turns = int(session.state.get("user:turns", 0)) + 1
        replies = []
        async for event in runner.run_async(
            user_id=user,
            session_id=session_id,
            new_message=types.Content(role="user", parts=[types.Part(text=question)]),
            state_delta={"user:turns": turns, "temp:scratch": "never stored"},
        ):
            if event.content and event.content.parts and event.author == "assistant":
                replies.append("".join(p.text or "" for p in event.content.parts))
        return {"output": replies[-1]}


COMMANDS: dict[str, Callable[..., Coroutine[Any, Any, Any]]] = {
    "openai-add": openai_add,
    "openai-turn": openai_turn,
    "adk-turn": adk_turn,
}


def main() -> None:
    command, *args = sys.argv[1:]
    converted: list[Any] = [int(a) if a.isdigit() else a for a in args]
    print(json.dumps(asyncio.run(COMMANDS[command](*converted))))


if __name__ == "__main__":
    main()
