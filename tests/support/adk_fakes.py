"""Google ADK's own Runner with a fake model (no network), for the tests."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from google.adk.agents.llm_agent import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.genai import types

from agentstate.client.aio import AsyncStateClient
from agentstate.integrations.adk import AgentStateSessionService


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


async def adk_turn(address: str, app: str, user: str, session_id: str, question: str) -> Any:
    """One turn with a fresh client, service and runner, as a new process would have."""
    async with AsyncStateClient.connect(address) as client:
        service = AgentStateSessionService(client)
        # output_key: each reply lands in the session state as "last_reply".
        agent = LlmAgent(name="assistant", model=RecallLlm(), output_key="last_reply")
        runner = Runner(agent=agent, app_name=app, session_service=service)
        if await service.get_session(app_name=app, user_id=user, session_id=session_id) is None:
            await service.create_session(
                app_name=app,
                user_id=user,
                session_id=session_id,
                state={"user:turns": 0, "topic": "orders"},
            )
        session = await service.get_session(app_name=app, user_id=user, session_id=session_id)
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
