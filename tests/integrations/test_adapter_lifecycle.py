"""Event loops and lifecycles of the three adapters and the async client (issue 22, item 5).

A grpc.aio channel belongs to the loop it was made on; these tests build every adapter
outside any loop (as the frameworks' docs snippets do) and use it from two `asyncio.run`
calls in a row, then close it with `close()` and with both kinds of context manager.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from google.adk.events.event import Event
from langchain_core.messages import HumanMessage

from agentstate.client import AsyncStateClient, ClientSettings, StateClient
from agentstate.examples.langgraph_approval.graph import QUESTION, build
from agentstate.integrations._connection import BoundedCache
from agentstate.integrations.adk import AgentStateSessionService
from agentstate.integrations.langgraph import AgentStateSaver
from agentstate.integrations.openai_agents import AgentStateSession


def config(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


def test_async_client_made_outside_a_loop_works_across_asyncio_runs(
    state_process_address: str,
) -> None:
    client = AsyncStateClient.connect(state_process_address)  # no loop running here
    user = f"loops-{uuid.uuid4()}"

    async def create() -> str:
        return (await client.create_conversation(user, "t")).conversation_id

    first = asyncio.run(create())
    second = asyncio.run(create())  # a new loop: the first loop's channel is gone with it

    async def listed() -> set[str]:
        page = await client.list_conversations(user)
        await client.close()
        return {c.conversation_id for c in page.items}

    assert asyncio.run(listed()) == {first, second}


def test_langgraph_saver_across_asyncio_runs_and_context_managers(
    state_process_address: str,
) -> None:
    saver = AgentStateSaver(state_process_address)
    graph = build(saver)
    thread = config(f"loops-{uuid.uuid4()}")
    start = {"messages": [HumanMessage(QUESTION)], "executed": []}
    first = asyncio.run(graph.ainvoke(start, thread))
    assert "__interrupt__" in first
    # A second asyncio.run with the same saver: it used to raise "Event loop is closed".
    again = asyncio.run(graph.aget_state(thread))
    assert again.values["messages"][0].content == QUESTION
    with saver:  # the sync half, then closed
        assert saver.get_tuple(thread) is not None

    async def in_async_with() -> None:
        async with AgentStateSaver(address=state_process_address) as other:
            assert await other.aget_tuple(thread) is not None

    asyncio.run(in_async_with())


def test_openai_session_across_asyncio_runs(state_process_address: str) -> None:
    user = f"loops-{uuid.uuid4()}"
    session = AgentStateSession("s", address=state_process_address, user_id=user)
    asyncio.run(session.add_items([{"role": "user", "content": "one"}]))
    asyncio.run(session.add_items([{"role": "user", "content": "two"}]))
    assert [i["content"] for i in asyncio.run(session.get_items())] == ["one", "two"]  # type: ignore[typeddict-item]
    session.close()
    with AgentStateSession(
        "s", settings=ClientSettings(state_address=state_process_address), user_id=user
    ) as again:
        assert len(asyncio.run(again.get_items())) == 2

    async def in_async_with() -> int:
        async with AgentStateSession("s", address=state_process_address, user_id=user) as third:
            return len(await third.get_items())

    assert asyncio.run(in_async_with()) == 2


def test_adk_service_across_asyncio_runs(state_process_address: str) -> None:
    user = f"loops-{uuid.uuid4()}"
    service = AgentStateSessionService(address=state_process_address)
    session = asyncio.run(service.create_session(app_name="app", user_id=user, session_id="s"))
    asyncio.run(service.append_event(session, Event(author="user", invocation_id="i")))
    found = asyncio.run(service.get_session(app_name="app", user_id=user, session_id="s"))
    assert found is not None and len(found.events) == 1

    async def in_async_with() -> int:
        async with AgentStateSessionService(state_process_address) as other:
            again = await other.get_session(app_name="app", user_id=user, session_id="s")
            assert again is not None
            return len(again.events)

    assert asyncio.run(in_async_with()) == 1
    asyncio.run(service.close())


def test_one_constructor_shape(state_process_address: str) -> None:
    settings = ClientSettings(state_address=state_process_address)
    client = AsyncStateClient.connect(state_process_address)
    for made in (
        AgentStateSaver(state_process_address),
        AgentStateSaver(address=state_process_address),
        AgentStateSaver(client=client),
        AgentStateSaver(settings),
        AgentStateSaver(settings=settings),
        AgentStateSaver(client),
        AgentStateSessionService(client),
        AgentStateSessionService(state_process_address),
        AgentStateSessionService(address=state_process_address),
        AgentStateSessionService(settings=settings),
        AgentStateSessionService(client=client),
        AgentStateSession("s", user_id="u", client=client),
        AgentStateSession("s", user_id="u", address=state_process_address),
        AgentStateSession("s", user_id="u", settings=settings),
    ):
        made.close() if not isinstance(made, AgentStateSessionService) else None
    with pytest.raises(ValueError, match="needs the state service"):
        AgentStateSaver()
    with pytest.raises(ValueError, match="needs the state service"):
        AgentStateSessionService()
    with pytest.raises(ValueError, match="needs the state service"):
        AgentStateSession("s", user_id="u")
    with pytest.raises(ValueError, match="not both"):
        AgentStateSession("s", user_id="u", address=state_process_address, settings=settings)
    with pytest.raises(ValueError, match="given twice"):
        AgentStateSaver(state_process_address, address=state_process_address)
    with pytest.raises(TypeError, match="takes an address"):
        AgentStateSessionService(42)  # type: ignore[arg-type]
    # A client it was given stays open after the adapter closes.
    saver = AgentStateSaver(client=client)
    asyncio.run(saver.aclose())

    async def still_open() -> None:
        await client.create_conversation(f"u-{uuid.uuid4()}")
        await client.close()

    asyncio.run(still_open())
    sync = StateClient.connect(state_process_address)
    with AgentStateSaver(sync_client=sync) as only_sync:
        assert only_sync.get_tuple(config(f"none-{uuid.uuid4()}")) is None
    sync.create_conversation(f"u-{uuid.uuid4()}")  # still open
    sync.close()


def test_caches_are_bounded() -> None:
    cache: BoundedCache[int, int] = BoundedCache(3)
    for n in range(10):
        cache[n] = n
        cache.get(0)  # the one used most stays
    assert len(cache) == 3 and cache.get(0) == 0 and cache.get(9) == 9 and cache.get(5) is None
