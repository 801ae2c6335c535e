"""An OpenAI Agents SDK agent whose session lives in the state service.

    pip install 'agentstate[openai-agents]'
    python -m agentstate.examples.frameworks.openai_agents_session [STATE_ADDRESS]

Two turns, each with a fresh client and session object (as two processes would have): the
second turn's model sees the first turn. The model is a small offline stand-in; use any
model of the SDK instead.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, Runner, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

from agentstate.client import AsyncStateClient
from agentstate.examples.frameworks._service import state_service_address
from agentstate.integrations.openai_agents import AgentStateSession


class OfflineModel(Model):
    """Says how many questions it has seen so far (the session's history) and the first."""

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[Any],
        *args: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        items = input if isinstance(input, list) else [{"role": "user", "content": input}]
        questions = [i["content"] for i in items if i.get("role") == "user"]
        text = f"You have asked {len(questions)} question(s); the first was {questions[0]!r}."
        message = ResponseOutputMessage(
            id="msg",
            type="message",
            role="assistant",
            status="completed",
            content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


async def turn(address: str, session_id: str, question: str) -> str:
    agent = Agent(name="assistant", instructions="Answer briefly.", model=OfflineModel())
    async with AsyncStateClient.connect(address) as state:
        # The two lines of wiring:
        session = AgentStateSession(session_id, client=state, user_id="alice")
        result = await Runner.run(agent, question, session=session)
        return str(result.final_output)


async def main(address: str) -> None:
    set_tracing_disabled(True)  # the SDK's tracing would export to OpenAI
    session_id = f"example-{uuid.uuid4()}"
    for question in ("Where is order 88235?", "Cancel it, please."):
        print(f"user: {question}\nagent: {await turn(address, session_id, question)}")


if __name__ == "__main__":
    with state_service_address() as address:
        asyncio.run(main(address))
