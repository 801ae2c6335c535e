"""Bad input to each adapter gets the framework's own kind of error (issue 22, item 7):
ValueError / TypeError for bad arguments, as LangGraph's savers, the OpenAI Agents SDK's
sessions and ADK's session services raise them, never a StateError of the gRPC client."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event

from agentstate.client import AsyncStateClient, StateError
from agentstate.integrations.adk import AgentStateSessionService
from agentstate.integrations.langgraph import AgentStateSaver
from agentstate.integrations.openai_agents import AgentStateSession

LONG = "x" * 300


@pytest.fixture
async def client(state_process_address: str) -> AsyncIterator[AsyncStateClient]:
    async with AsyncStateClient.connect(state_process_address) as connected:
        yield connected


async def refused(call: Awaitable[Any], kind: type[Exception], match: str | None = None) -> None:
    with pytest.raises(kind, match=match) as raised:
        await call
    assert not isinstance(raised.value, StateError), repr(raised.value)


async def test_langgraph_bad_input(client: AsyncStateClient, state_process_address: str) -> None:
    saver = AgentStateSaver(client=client, user_id=f"errors-{uuid.uuid4()}")
    good = f"t-{uuid.uuid4()}"
    for bad in ("a\x00b", LONG):
        await refused(
            saver.aget_tuple({"configurable": {"thread_id": bad}}),
            ValueError,
            "thread_id",
        )
        await refused(saver.acopy_thread(bad, good), ValueError, "thread_id")
        await refused(saver.aprune([bad]), ValueError)
        await refused(saver.adelete_thread(bad), ValueError)
        await refused(
            saver.aget_tuple({"configurable": {"thread_id": good, "user_id": bad}}),
            ValueError,
            "user_id",
        )
    await refused(saver.aget_tuple({}), ValueError, "configurable")
    await refused(saver.aprune([good], strategy="all"), ValueError, "strategy")
    with AgentStateSaver(state_process_address) as sync_saver:
        with pytest.raises(ValueError, match="thread_id"):
            sync_saver.copy_thread("a\x00", good)
        with pytest.raises(ValueError, match="thread_id"):
            sync_saver.prune(["a\x00"])
    with pytest.raises(ValueError, match="user_id"):
        AgentStateSaver(client=client, user_id="")
    with pytest.raises(ValueError, match="run_lease_seconds"):
        AgentStateSaver(client=client, run_lease_seconds=0)


async def test_openai_bad_input(client: AsyncStateClient) -> None:
    user = f"errors-{uuid.uuid4()}"
    for bad in ("", "a\x00b", LONG):
        with pytest.raises(ValueError, match="session_id"):
            AgentStateSession(bad, client=client, user_id=user)
    with pytest.raises(ValueError, match="user_id"):
        AgentStateSession("s", client=client, user_id="")
    bad_user = AgentStateSession("s", client=client, user_id="a\x00b")
    await refused(bad_user.add_items([{"role": "user", "content": "x"}]), ValueError)
    await refused(bad_user.get_items(), ValueError)
    session = AgentStateSession("s", client=client, user_id=user)
    await refused(session.add_items([{"content": {1, 2}}]), TypeError)  # type: ignore[list-item]
    assert await session.get_items() == []  # nothing stored by the refused call


async def test_adk_bad_input(client: AsyncStateClient) -> None:
    service = AgentStateSessionService(client)
    user = f"errors-{uuid.uuid4()}"
    await refused(service.create_session(app_name="", user_id=user), ValueError, "app_name")
    await refused(service.create_session(app_name="a", user_id=""), ValueError, "user_id")
    await refused(
        service.create_session(app_name="a", user_id=user, session_id=LONG),
        ValueError,
        "not usable",
    )
    await refused(service.create_session(app_name="a", user_id="u\x00v"), ValueError)
    await refused(
        service.get_session(app_name="a", user_id=user, session_id="s\x00"),
        ValueError,
        "not usable",
    )
    await refused(service.list_sessions(app_name="", user_id=user), ValueError, "app_name")
    session = await service.create_session(app_name="a", user_id=user, session_id="s")
    await service.delete_session(app_name="a", user_id=user, session_id="s")
    with pytest.raises(SessionNotFoundError):
        await service.append_event(session, Event(author="user", invocation_id="i"))
