"""A time to live through each adapter (issue 23, item 2): the OpenAI session's constructor
option, ADK's per-session `create_session(ttl=...)` (as VertexAiSessionService) and the
service's default, LangGraph's config["configurable"]["ttl_seconds"] and the saver's
default. Each is checked on a real state service (memory and PostgreSQL): the conversation
shows the expiry, a write renews it under RENEW_ON_WRITE, the retention sweep (the server's
own `purge`, as its sweeper runs it) deletes it once expired and spares the others, and a
bad value is the framework's ValueError with nothing stored."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

import pytest
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.graph import END, START, StateGraph

from agentstate.client import StateClient
from agentstate.client.aio import AsyncStateClient
from agentstate.client.errors import NotFound
from agentstate.client.types import Conversation
from agentstate.integrations.adk import AgentStateSessionService, session_key
from agentstate.integrations.langgraph import AgentStateSaver
from agentstate.integrations.openai_agents import AgentStateSession
from agentstate.integrations.openai_agents import session_key as openai_key
from agentstate.state_service.server import purge
from agentstate.state_service.storage.base import StateStore

TEN_YEARS_AND_MORE = 10 * 365 * 24 * 3600 + 1


@pytest.fixture
async def client(state_address: str) -> AsyncIterator[AsyncStateClient]:
    async with AsyncStateClient.connect(state_address) as connected:
        yield connected


async def conversation(client: AsyncStateClient, user_id: str, key: str) -> Conversation:
    return (await client.resolve_conversation(user_id, key, create=False)).conversation


async def absent(client: AsyncStateClient, user_id: str, key: str) -> bool:
    try:
        await client.resolve_conversation(user_id, key, create=False)
    except NotFound:
        return True
    return False


def expires_in(found: Conversation, seconds: int, *, since: datetime) -> None:
    assert found.ttl_seconds == seconds
    assert found.expire_time is not None
    assert abs(found.expire_time - (since + timedelta(seconds=seconds))) < timedelta(seconds=1)


async def sweep_after_expiry(store: StateStore, *expiring: Conversation) -> None:
    """Wait until each conversation is past its expiry, then run one retention sweep."""
    latest = max(c.expire_time for c in expiring if c.expire_time is not None)
    await asyncio.sleep(max(0.0, (latest - datetime.now(UTC)).total_seconds()) + 0.2)
    counts = await purge(store, None)
    assert counts.conversations >= len(expiring)


# ------------------------------------------------------------------ OpenAI Agents


async def test_openai_session_ttl(
    store: StateStore, client: AsyncStateClient, user_id: str
) -> None:
    fixed = AgentStateSession("fixed", client=client, user_id=user_id, ttl_seconds=3600)
    await fixed.add_items([{"role": "user", "content": "hi"}])
    found = await conversation(client, user_id, openai_key("fixed"))
    assert not found.ttl_renewed_by_writes
    expires_in(found, 3600, since=found.create_time)
    await fixed.add_items([{"role": "user", "content": "again"}])
    assert (await conversation(client, user_id, openai_key("fixed"))).expire_time == (
        found.expire_time
    )

    renewed = AgentStateSession(
        "renewed", client=client, user_id=user_id, ttl_seconds=1, ttl_renewed_by_writes=True
    )
    await renewed.add_items([{"role": "user", "content": "hi"}])
    first = await conversation(client, user_id, openai_key("renewed"))
    assert first.ttl_renewed_by_writes and first.expire_time is not None
    await asyncio.sleep(0.3)
    await renewed.add_items([{"role": "assistant", "content": "hello"}])
    second = await conversation(client, user_id, openai_key("renewed"))
    assert second.expire_time is not None and second.expire_time > first.expire_time
    expires_in(second, 1, since=second.update_time)
    await asyncio.sleep(0.2)
    await renewed.add_items([{"role": "user", "content": "more"}])
    assert await renewed.pop_item() is not None  # a pop is a write: it renews too
    third = await conversation(client, user_id, openai_key("renewed"))
    assert third.expire_time is not None and third.expire_time > second.expire_time
    second = third

    forever = AgentStateSession("forever", client=client, user_id=user_id)
    await forever.add_items([{"role": "user", "content": "hi"}])
    assert (await conversation(client, user_id, openai_key("forever"))).expire_time is None

    await sweep_after_expiry(store, second)
    assert await absent(client, user_id, openai_key("renewed"))
    assert await renewed.get_items() == []  # an expired session is an empty one
    assert len(await fixed.get_items()) == 2 and len(await forever.get_items()) == 1


@pytest.mark.parametrize("bad", [0, -5, "60", 1.5, True])
async def test_openai_session_bad_ttl(client: AsyncStateClient, user_id: str, bad: Any) -> None:
    with pytest.raises(ValueError, match="ttl_seconds"):
        AgentStateSession("s", client=client, user_id=user_id, ttl_seconds=bad)


async def test_openai_session_ttl_over_the_service_limit(
    client: AsyncStateClient, user_id: str
) -> None:
    with pytest.raises(ValueError, match="ttl_renewed_by_writes"):
        AgentStateSession("s", client=client, user_id=user_id, ttl_renewed_by_writes=True)
    session = AgentStateSession("s", client=client, user_id=user_id, ttl_seconds=TEN_YEARS_AND_MORE)
    with pytest.raises(ValueError, match="ten years"):
        await session.add_items([{"role": "user", "content": "hi"}])
    assert await absent(client, user_id, openai_key("s"))  # nothing stored


# ----------------------------------------------------------------------------- ADK


def event(text: str, **delta: Any) -> Event:
    return Event(
        invocation_id="i",
        author="user",
        actions=EventActions(state_delta=delta),
        custom_metadata={"text": text},
    )


async def test_adk_session_ttl(store: StateStore, client: AsyncStateClient, user_id: str) -> None:
    app = f"app-{uuid.uuid4()}"
    service = AgentStateSessionService(client, ttl_seconds=3600)
    default = await service.create_session(app_name=app, user_id=user_id, session_id="default")
    found = await conversation(client, user_id, session_key(app, "default"))
    expires_in(found, 3600, since=found.create_time)
    assert not found.ttl_renewed_by_writes

    # Per session, as VertexAiSessionService takes it: a duration string, or an expiry.
    hours = await service.create_session(
        app_name=app, user_id=user_id, session_id="hours", ttl=timedelta(hours=2)
    )
    found = await conversation(client, user_id, session_key(app, hours.id))
    expires_in(found, 7200, since=found.create_time)
    await service.create_session(app_name=app, user_id=user_id, session_id="int", ttl=90)
    found = await conversation(client, user_id, session_key(app, "int"))
    expires_in(found, 90, since=found.create_time)
    until = datetime.now(UTC) + timedelta(days=1)
    await service.create_session(
        app_name=app, user_id=user_id, session_id="until", expire_time=until.isoformat()
    )
    found = await conversation(client, user_id, session_key(app, "until"))
    assert found.expire_time is not None and abs(found.expire_time - until) < timedelta(seconds=2)

    short = await service.create_session(
        app_name=app,
        user_id=user_id,
        session_id="short",
        state={"k": 1},
        ttl="1s",
        ttl_renewed_by_writes=True,
    )
    first = await conversation(client, user_id, session_key(app, "short"))
    assert first.ttl_seconds == 1 and first.ttl_renewed_by_writes
    await asyncio.sleep(0.3)
    await service.append_event(short, event("one", k=2))  # an event renews it
    second = await conversation(client, user_id, session_key(app, "short"))
    assert first.expire_time is not None and second.expire_time is not None
    assert second.expire_time > first.expire_time

    await sweep_after_expiry(store, second)
    assert await service.get_session(app_name=app, user_id=user_id, session_id="short") is None
    left = await service.list_sessions(app_name=app, user_id=user_id)
    assert sorted(s.id for s in left.sessions) == sorted([default.id, "hours", "int", "until"])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ttl": "soon"}, "duration"),
        ({"ttl": 0}, "ttl"),
        ({"ttl": "-5s"}, "duration"),
        ({"ttl": 3.5}, "ttl"),
        ({"ttl": "60s", "expire_time": "2099-01-01T00:00:00Z"}, "simultaneously"),
        ({"expire_time": "2000-01-01T00:00:00Z"}, "expire_time"),
        ({"expire_time": "tomorrow"}, "RFC 3339"),
        ({"expire_time": datetime(2099, 1, 1)}, "time zone"),  # naive: the point
        ({"expire_time": "2099-01-01T00:00:00Z", "ttl_renewed_by_writes": True}, "fixed"),
        ({"ttl": "60s", "ttl_renewed_by_writes": "yes"}, "bool"),
        ({"ttl": TEN_YEARS_AND_MORE}, "ten years"),  # the service's limit
    ],
)
async def test_adk_bad_ttl(
    client: AsyncStateClient, user_id: str, options: dict[str, Any], message: str
) -> None:
    service = AgentStateSessionService(client)
    app = f"app-{uuid.uuid4()}"
    with pytest.raises(ValueError, match=message):
        await service.create_session(app_name=app, user_id=user_id, session_id="s", **options)
    assert await service.get_session(app_name=app, user_id=user_id, session_id="s") is None


async def test_adk_unknown_option_and_bad_default(client: AsyncStateClient, user_id: str) -> None:
    service = AgentStateSessionService(client)
    with pytest.raises(TypeError, match="ttl_minutes"):
        await service.create_session(app_name="a", user_id=user_id, ttl_minutes=5)
    with pytest.raises(ValueError, match="ttl_seconds"):
        AgentStateSessionService(client, ttl_seconds=-1)


# ----------------------------------------------------------------------- LangGraph


class Counter(TypedDict):
    n: int


def graph(saver: AgentStateSaver) -> Any:
    builder = StateGraph(Counter)
    builder.add_node("add", lambda state: {"n": state["n"] + 1})
    builder.add_edge(START, "add")
    builder.add_edge("add", END)
    return builder.compile(checkpointer=saver)


def config(thread_id: str, **extra: Any) -> Any:
    return {"configurable": {"thread_id": thread_id, **extra}}


async def test_langgraph_ttl(store: StateStore, client: AsyncStateClient, user_id: str) -> None:
    saver = AgentStateSaver(client, user_id=user_id, ttl_seconds=3600)
    compiled = graph(saver)
    await compiled.ainvoke({"n": 0}, config("default"))
    found = await conversation(client, user_id, "default")
    expires_in(found, 3600, since=found.create_time)

    # The config's keys override the saver's for the thread they create; each checkpoint
    # of a RENEW_ON_WRITE thread renews it.
    short = config("short", ttl_seconds=1, ttl_renewed_by_writes=True)
    await compiled.ainvoke({"n": 0}, short)
    first = await conversation(client, user_id, "short")
    assert first.ttl_seconds == 1 and first.ttl_renewed_by_writes
    await asyncio.sleep(0.3)
    await compiled.ainvoke({"n": 5}, short)
    second = await conversation(client, user_id, "short")
    assert first.expire_time is not None and second.expire_time is not None
    assert second.expire_time > first.expire_time

    await compiled.ainvoke({"n": 0}, config("none", ttl_seconds=None))
    assert (await conversation(client, user_id, "none")).expire_time is None
    # A copy is a new thread: the saver's time to live.
    await saver.acopy_thread("none", "copy")
    found = await conversation(client, user_id, "copy")
    expires_in(found, 3600, since=found.create_time)

    await sweep_after_expiry(store, second)
    assert await saver.aget_tuple(config("short")) is None
    assert await saver.aget_tuple(config("default")) is not None
    # The thread starts afresh, with its time to live again.
    assert (await compiled.ainvoke({"n": 10}, short))["n"] == 11
    assert (await conversation(client, user_id, "short")).ttl_seconds == 1


async def test_langgraph_sync_saver_ttl(state_address: str, user_id: str) -> None:
    def put_and_read() -> Conversation:
        with StateClient.connect(state_address) as sync_client:
            saver = AgentStateSaver(sync_client=sync_client, user_id=user_id)
            checkpoint = empty_checkpoint()
            checkpoint["id"] = str(uuid6(clock_seq=-1))
            saver.put(config("sync", ttl_seconds=120), checkpoint, {"step": -1}, {})
            return sync_client.resolve_conversation(user_id, "sync", create=False).conversation

    # In a thread: the server runs on this test's event loop.
    found = await asyncio.to_thread(put_and_read)
    expires_in(found, 120, since=found.create_time)


@pytest.mark.parametrize(
    ("ttl", "message"),
    [
        ({"ttl_seconds": "60"}, "ttl_seconds"),
        ({"ttl_seconds": 0}, "ttl_seconds"),
        ({"ttl_seconds": 60, "ttl_renewed_by_writes": 1}, "bool"),
        ({"ttl_renewed_by_writes": True}, "ttl_renewed_by_writes"),
        ({"ttl_seconds": TEN_YEARS_AND_MORE}, "ten years"),
    ],
)
async def test_langgraph_bad_ttl(
    client: AsyncStateClient, user_id: str, ttl: dict[str, Any], message: str
) -> None:
    saver = AgentStateSaver(client, user_id=user_id)
    with pytest.raises(ValueError, match=message):
        await graph(saver).ainvoke({"n": 0}, config("bad", **ttl))
    assert await absent(client, user_id, "bad")  # nothing stored
    checkpoint = empty_checkpoint()
    checkpoint["id"] = str(uuid6(clock_seq=-1))
    with pytest.raises(ValueError, match=message):
        await saver.aput(config("bad", **ttl), checkpoint, {"step": -1}, {})
    assert await absent(client, user_id, "bad")


def test_langgraph_bad_default(state_address: str) -> None:
    with pytest.raises(ValueError, match="ttl_seconds"):
        AgentStateSaver(state_address, ttl_seconds=0)
