"""A Google ADK agent whose sessions live in the state service.

    pip install 'agentstate[adk]'
    python -m agentstate.examples.frameworks.adk_session_service [STATE_ADDRESS]

Two turns through ADK's Runner, each with a fresh client and service (as two processes
would have), with session-, user- and temp-scoped state. The model is a small offline
stand-in; use Gemini or any ADK model instead.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator

from google.adk.agents.llm_agent import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.genai import types

from agentstate.client import AsyncStateClient
from agentstate.examples.frameworks._service import state_service_address
from agentstate.integrations.adk import AgentStateSessionService

APP = "shop"


class OfflineLlm(BaseLlm):
    """Says how many questions the request holds (the session's events) and the first."""

    model: str = "offline"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        questions = [
            "".join(p.text or "" for p in c.parts or [])
            for c in llm_request.contents
            if c.role == "user"
        ]
        text = f"You have asked {len(questions)} question(s); the first was {questions[0]!r}."
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))


async def turn(address: str, session_id: str, question: str) -> str:
    agent = LlmAgent(name="assistant", model=OfflineLlm(), output_key="last_reply")
    async with AsyncStateClient.connect(address) as state:
        # The two lines of wiring:
        sessions = AgentStateSessionService(state)
        runner = Runner(agent=agent, app_name=APP, session_service=sessions)
        if not await sessions.get_session(app_name=APP, user_id="alice", session_id=session_id):
            await sessions.create_session(
                app_name=APP, user_id="alice", session_id=session_id, state={"topic": "orders"}
            )
        reply = ""
        async for event in runner.run_async(
            user_id="alice",
            session_id=session_id,
            new_message=types.Content(role="user", parts=[types.Part(text=question)]),
            state_delta={"user:last_question": question, "temp:draft": "never stored"},
        ):
            if event.author == "assistant" and event.content and event.content.parts:
                reply = "".join(p.text or "" for p in event.content.parts)
        session = await sessions.get_session(app_name=APP, user_id="alice", session_id=session_id)
        assert session is not None
        shown = {k: v for k, v in session.state.items() if k != "last_reply"}
        return f"{reply}\n  stored state: {shown}"


async def main(address: str) -> None:
    session_id = f"example-{uuid.uuid4()}"
    for question in ("Where is order 88235?", "Cancel it, please."):
        print(f"user: {question}\nagent: {await turn(address, session_id, question)}")


if __name__ == "__main__":
    with state_service_address() as address:
        asyncio.run(main(address))
