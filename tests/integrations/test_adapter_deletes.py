"""Deletes that delete (issue 22, item 4): after delete_thread, delete_session and
clear_session, the PostgreSQL tables hold nothing of what was deleted. Each test reads the
tables directly: every table with a user_id column, counted for the test's own users."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6

from agentstate.client import AsyncStateClient
from agentstate.examples.langgraph_approval.graph import QUESTION, build
from agentstate.integrations.adk import AgentStateSessionService
from agentstate.integrations.langgraph import AgentStateSaver
from agentstate.integrations.openai_agents import AgentStateSession


def rows_of(database_url: str, *users: str) -> dict[str, int]:
    """table -> its rows of `users`, for every table with a user_id column (tables that
    hold none are left out)."""
    counts = {}
    with psycopg.connect(database_url) as db:
        tables = [
            r[0]
            for r in db.execute(
                "SELECT table_name FROM information_schema.columns "
                "WHERE table_schema = 'public' AND column_name = 'user_id' ORDER BY 1"
            )
        ]
        assert {"t_conversation", "t_checkpoint", "t_conversation_item"} <= set(tables)
        for table in tables:
            row = db.execute(
                f"SELECT count(*) FROM {table} WHERE user_id = ANY(%s)",
                [list(users)],
            ).fetchone()
            assert row is not None
            if row[0]:
                counts[table] = row[0]
    return counts


def config(thread_id: str, **extra: Any) -> Any:
    return {"configurable": {"thread_id": thread_id, **extra}}


async def test_delete_thread_removes_every_user_namespace_and_copy(
    state_process_address: str, database_url: str
) -> None:
    owner, other = f"lg-owner-{uuid.uuid4()}", f"lg-other-{uuid.uuid4()}"
    saver = AgentStateSaver(state_process_address, user_id=owner)
    graph = build(saver)
    thread, copy = f"t-{uuid.uuid4()}", f"copy-{uuid.uuid4()}"
    start = {"messages": [HumanMessage(QUESTION)], "executed": []}
    await graph.ainvoke(start, config(thread))
    # The same thread run as another user (config["configurable"]["user_id"]): this was
    # left behind by delete_thread before.
    await graph.ainvoke(start, config(thread, user_id=other))
    # A checkpoint of a subgraph's namespace, with pending writes.
    sub = empty_checkpoint()
    sub["id"] = str(uuid6(clock_seq=-1))
    stored = await saver.aput(config(thread, checkpoint_ns="child"), sub, {"step": -1}, {})
    await saver.aput_writes(stored, [("x", 1)], "task-1")
    await saver.acopy_thread(thread, copy)
    assert set(rows_of(database_url, other)) >= {"t_conversation", "t_checkpoint"}

    await saver.adelete_thread(thread)
    assert rows_of(database_url, other) == {}
    # The owner keeps only the copy: one conversation with its checkpoints.
    with psycopg.connect(database_url) as db:
        keys = db.execute(
            "SELECT external_key FROM t_conversation WHERE user_id = %s", [owner]
        ).fetchall()
    assert keys == [(copy,)]
    assert await saver.aget_tuple(config(thread)) is None
    assert await saver.aget_tuple(config(thread, user_id=other)) is None
    copied = await saver.aget_tuple(config(copy))
    assert copied is not None and copied.checkpoint["channel_values"]["messages"]

    saver.delete_thread(copy)  # the sync half too
    assert rows_of(database_url, owner, other) == {}
    await saver.aclose()


async def test_delete_thread_of_a_thread_only_another_user_ran(
    state_process_address: str, database_url: str
) -> None:
    owner, other = f"lg-owner-{uuid.uuid4()}", f"lg-other-{uuid.uuid4()}"
    thread = f"t-{uuid.uuid4()}"
    writer = AgentStateSaver(state_process_address, user_id=owner)
    graph = build(writer)
    start = {"messages": [HumanMessage(QUESTION)], "executed": []}
    graph.invoke(start, config(thread, user_id=other))
    await writer.aclose()
    # Another replica, which never saw the thread, deletes it.
    async with AgentStateSaver(state_process_address, user_id=owner) as deleter:
        await deleter.adelete_thread(thread)
    assert rows_of(database_url, owner, other) == {}


async def test_adk_delete_session_removes_its_conversation_events_and_state(
    state_process_address: str, database_url: str
) -> None:
    user = f"adk-{uuid.uuid4()}"
    async with AgentStateSessionService(address=state_process_address) as service:
        session = await service.create_session(
            app_name="app", user_id=user, session_id="s", state={"k": 1, "user:name": "x"}
        )
        event = Event(author="user", invocation_id="i", actions=EventActions(state_delta={"k": 2}))
        await service.append_event(session, event)
        assert {"t_conversation", "t_conversation_item", "t_agent_state"} <= set(
            rows_of(database_url, user)
        )
        await service.delete_session(app_name="app", user_id=user, session_id="s")
        # user: state belongs to the user, not the session: it stays, as in ADK's own
        # services (the lifecycle issue erases a user).
        assert rows_of(database_url, user) == {"t_scoped_state": 1}
        assert await service.get_session(app_name="app", user_id=user, session_id="s") is None


async def test_openai_clear_session_removes_its_items_and_conversation(
    state_process_address: str, database_url: str
) -> None:
    user = f"oa-{uuid.uuid4()}"
    async with AsyncStateClient.connect(state_process_address) as client:
        session = AgentStateSession("s", client=client, user_id=user)
        await session.add_items([{"role": "user", "content": "one"}])
        await session.add_items([{"role": "user", "content": "two"}])
        assert rows_of(database_url, user) == {"t_conversation": 1, "t_conversation_item": 2}
        await session.clear_session()
        assert rows_of(database_url, user) == {}
        assert await session.get_items() == []
        assert await session.pop_item() is None
        await session.add_items([{"role": "user", "content": "three"}])  # afresh
        assert [i["content"] for i in await session.get_items()] == ["three"]  # type: ignore[typeddict-item]
        await session.clear_session()
        assert rows_of(database_url, user) == {}
