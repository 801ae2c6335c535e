"""The Google ADK session service on the state service (agentstate.integrations.adk).

The same operations give what ADK's InMemorySessionService gives; a Runner keeps session
state over two turns in two processes; a stale session object is StaleSessionError with
nothing written; temp: state is never stored; delete removes everything; bad input gets
ADK's errors.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pydantic
import pytest
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions import InMemorySessionService
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig
from google.adk.sessions.session import Session
from google.genai import types

from agentstate.client.aio import AsyncStateClient
from agentstate.client.errors import NotFound
from agentstate.integrations.adk import SESSION_STATE_KEY, AgentStateSessionService, session_key
from agentstate.integrations.adk import session_service as adk_module

T0 = 1_760_000_000.0


@pytest.fixture
def app(user_id: str) -> str:
    """An app of its own: app-scoped state is shared by every user of an app."""
    return f"shop-{user_id}"


@pytest.fixture
async def client(state_address: str) -> AsyncIterator[AsyncStateClient]:
    async with AsyncStateClient.connect(state_address) as connected:
        yield connected


def _event(n: int, delta: dict[str, Any] | None = None, author: str = "user") -> Event:
    return Event(
        id=f"e{n}",
        invocation_id="inv-1",
        author=author,
        timestamp=T0 + n,
        content=types.Content(role="user", parts=[types.Part(text=f"message {n}")]),
        actions=EventActions(state_delta=delta or {}),
    )


def _view(session: Session | None) -> Any:
    """What a caller can observe of a session (ids, state, events), timestamps aside."""
    if session is None:
        return None
    return {
        "id": session.id,
        "app_name": session.app_name,
        "user_id": session.user_id,
        "state": session.state,
        "events": [e.model_dump(exclude_none=True) for e in session.events],
    }


async def _sequence(service: BaseSessionService, user: str, app: str) -> list[Any]:
    seen: list[Any] = []
    a = await service.create_session(
        app_name=app,
        user_id=user,
        session_id="  s-1 ",
        state={"topic": "orders", "app:motd": "hi", "user:name": "Ann", "temp:x": 1},
    )
    seen.append(_view(a))
    b = await service.create_session(app_name=app, user_id=user, state={"k": 0})
    seen.append(sorted(b.state.items()))
    for n in range(1, 6):
        delta: dict[str, Any] = {"count": n, "user:seen": n, "temp:scratch": n}
        if n == 3:
            delta["app:motd"] = "changed"
        event = await service.append_event(a, _event(n, delta))
        seen.append(event.actions.state_delta)
    seen.append(a.state.get("temp:scratch"))  # the invocation's own object keeps temp:
    seen.append(_view(await service.get_session(app_name=app, user_id=user, session_id="s-1")))
    for config in (
        GetSessionConfig(num_recent_events=2),
        GetSessionConfig(num_recent_events=0),
        GetSessionConfig(after_timestamp=T0 + 4),
        GetSessionConfig(num_recent_events=3, after_timestamp=T0 + 4),
    ):
        got = await service.get_session(app_name=app, user_id=user, session_id="s-1", config=config)
        seen.append(_view(got))
    listed = await service.list_sessions(app_name=app, user_id=user)
    seen.append(sorted((s.id == b.id, sorted(s.state.items()), s.events) for s in listed.sessions))
    seen.append(await service.get_user_state(app_name=app, user_id=user))
    await service.delete_session(app_name=app, user_id=user, session_id="s-1")
    seen.append(_view(await service.get_session(app_name=app, user_id=user, session_id="s-1")))
    await service.delete_session(app_name=app, user_id=user, session_id="never-was")
    seen.append(await service.get_session(app_name="other", user_id=user, session_id=b.id))
    return seen


async def test_same_results_as_in_memory_service(
    client: AsyncStateClient, user_id: str, app: str
) -> None:
    theirs = await _sequence(InMemorySessionService(), user_id, app)
    ours = await _sequence(AgentStateSessionService(client), user_id, app)
    for step, (mine, reference) in enumerate(zip(ours, theirs, strict=True)):
        assert mine == reference, f"step {step}"


async def test_get_session_is_one_call_reading_only_what_came_since(
    client: AsyncStateClient, user_id: str, app: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """get_session of a known session is one ListItems call (events, session state and
    app:/user: state together) carrying only the events since the last read; events
    appended, and sessions deleted and made again, by another process are seen, as
    InMemorySessionService sees them; changing a returned session changes nothing kept."""
    ours = AgentStateSessionService(client)
    elsewhere = AgentStateSessionService(client)  # another process
    theirs = InMemorySessionService()
    calls: list[tuple[str, int]] = []
    call = client._call

    async def counted(op: Any, timeout: float | None) -> Any:  # noqa: ASYNC109
        result = None
        try:
            result = await call(op, timeout)
            return result
        finally:  # a refused call too (carrying nothing)
            calls.append((op.method, len(getattr(result, "items", []) or [])))

    monkeypatch.setattr(client, "_call", counted)
    key: dict[str, Any] = {"app_name": app, "user_id": user_id, "session_id": "since"}

    async def create(service: BaseSessionService) -> None:
        for side in (service, theirs):
            await side.create_session(**key, state={"k": 1, "user:name": "Ann"})

    async def append(service: BaseSessionService, n: int) -> None:
        for side in (service, theirs):
            session = await side.get_session(**key)
            assert session is not None
            await side.append_event(session, _event(n, {"k": n, "app:motd": f"hi {n}"}))

    async def get(carried: list[tuple[str, int]]) -> Session:
        calls.clear()
        session = await ours.get_session(**key)
        assert _view(session) == _view(await theirs.get_session(**key))
        assert calls == carried
        assert session is not None
        return session

    await create(ours)
    await append(ours, 1)
    await append(ours, 2)
    await get([("ListItems", 1)])  # event 2, appended since append 2's read
    await get([("ListItems", 0)])  # nothing since
    await append(elsewhere, 3)
    session = await get([("ListItems", 1)])  # the one event appended elsewhere
    session.events[0].content = None  # the caller's copy
    session.events.clear()
    await get([("ListItems", 0)])
    recent = await ours.get_session(**key, config=GetSessionConfig(num_recent_events=2))
    expected = await theirs.get_session(**key, config=GetSessionConfig(num_recent_events=2))
    assert _view(recent) == _view(expected)
    # Deleted and made again elsewhere: the old id is NOT_FOUND, then one lookup.
    for side in (elsewhere, theirs):
        await side.delete_session(**key)
    await create(elsewhere)
    await append(elsewhere, 4)
    await get([("ListItems", 0), ("ResolveConversation", 0), ("ListItems", 1)])
    await get([("ListItems", 0)])
    # A session longer than the kept bound is read whole, every time.
    monkeypatch.setattr(adk_module, "MAX_KNOWN_EVENTS", 1)
    await append(elsewhere, 5)
    await get([("ListItems", 1), ("ListItems", 2)])  # since: 1, over the bound: all
    await get([("ListItems", 2)])


async def test_create_existing_id_and_missing_session(
    client: AsyncStateClient, user_id: str, app: str
) -> None:
    service = AgentStateSessionService(client)
    await service.create_session(app_name=app, user_id=user_id, session_id="dup")
    with pytest.raises(AlreadyExistsError):
        await service.create_session(app_name=app, user_id=user_id, session_id="dup")
    # Same id in another app is another session.
    await service.create_session(app_name="other-app", user_id=user_id, session_id="dup")
    ghost = Session(app_name=app, user_id=user_id, id="ghost")
    with pytest.raises(SessionNotFoundError):
        await service.append_event(ghost, _event(1))


async def test_stale_session_is_refused(client: AsyncStateClient, user_id: str, app: str) -> None:
    service = AgentStateSessionService(client)
    await service.create_session(app_name=app, user_id=user_id, session_id="s", state={"n": 0})
    first = await service.get_session(app_name=app, user_id=user_id, session_id="s")
    second = await service.get_session(app_name=app, user_id=user_id, session_id="s")
    assert first is not None and second is not None
    await service.append_event(first, _event(1, {"n": 1, "app:a": 1}))
    with pytest.raises(StaleSessionError):
        await service.append_event(second, _event(2, {"n": 2, "app:a": 2, "user:u": 2}))
    # Nothing of the refused event was stored, in any scope.
    fresh = await service.get_session(app_name=app, user_id=user_id, session_id="s")
    assert fresh is not None
    assert [e.id for e in fresh.events] == ["e1"]
    assert fresh.state == {"n": 1, "app:a": 1}
    # The one that wrote carries on; a reloaded copy does too.
    await service.append_event(first, _event(3, {"n": 3}))
    with pytest.raises(StaleSessionError):
        await service.append_event(fresh, _event(4))
    reloaded = await service.get_session(app_name=app, user_id=user_id, session_id="s")
    assert reloaded is not None
    await service.append_event(reloaded, _event(5, {"n": 5}))
    final = await service.get_session(app_name=app, user_id=user_id, session_id="s")
    assert final is not None and [e.id for e in final.events] == ["e1", "e3", "e5"]


async def test_redelivered_event_is_idempotent_as_in_memory(
    client: AsyncStateClient, user_id: str, app: str
) -> None:
    """The issue's case: the same event id delivered twice was stored twice. Now an equal
    re-delivery changes nothing on both services, from the session object that appended it
    and from one loaded before it (a retry whose first answer was lost)."""
    seen = []
    for service in (AgentStateSessionService(client), InMemorySessionService()):
        user = f"{user_id}-{type(service).__name__}"
        await service.create_session(app_name=app, user_id=user, session_id="s", state={"n": 0})
        first = await service.get_session(app_name=app, user_id=user, session_id="s")
        behind = await service.get_session(app_name=app, user_id=user, session_id="s")
        assert first is not None and behind is not None
        event = _event(1, {"n": 1, "user:seen": 1})
        await service.append_event(first, event.model_copy(deep=True))
        await service.append_event(first, event.model_copy(deep=True))  # the same object
        await service.append_event(behind, event.model_copy(deep=True))  # loaded before
        stored = await service.get_session(app_name=app, user_id=user, session_id="s")
        assert stored is not None
        seen.append(([e.id for e in stored.events], stored.state))
    assert seen[0] == seen[1] == (["e1"], {"n": 1, "user:seen": 1})


async def test_temp_state_is_never_stored(client: AsyncStateClient, user_id: str, app: str) -> None:
    service = AgentStateSessionService(client)
    session = await service.create_session(
        app_name=app, user_id=user_id, session_id="t", state={"temp:a": 1, "b": 2}
    )
    event = await service.append_event(session, _event(1, {"temp:c": 3, "d": 4, "user:temp:e": 5}))
    assert session.state["temp:c"] == 3  # this invocation sees it
    assert event.actions.state_delta == {"d": 4, "user:temp:e": 5}
    resolved = await client.resolve_conversation(user_id, session_key(app, "t"), create=False)
    cid = resolved.conversation.conversation_id
    stored = await client.get_state(user_id, cid, state_key=SESSION_STATE_KEY)
    assert json.loads(stored.payload) == {"b": 2, "d": 4}
    items = await client.list_items(user_id, cid)
    assert "temp:" not in items.items[0].item_json.decode().replace("user:temp:e", "")
    scoped = await client.get_scoped_state(user_id, app)
    assert scoped.user is not None and json.loads(scoped.user.payload) == {"temp:e": 5}


async def test_delete_removes_everything(client: AsyncStateClient, user_id: str, app: str) -> None:
    service = AgentStateSessionService(client)
    session = await service.create_session(
        app_name=app, user_id=user_id, session_id="d", state={"x": 1}
    )
    await service.append_event(session, _event(1, {"y": 2}))
    resolved = await client.resolve_conversation(user_id, session_key(app, "d"), create=False)
    cid = resolved.conversation.conversation_id
    await service.delete_session(app_name=app, user_id=user_id, session_id="d")
    with pytest.raises(NotFound):
        await client.list_items(user_id, cid)
    with pytest.raises(NotFound):
        await client.get_conversation(user_id, cid)
    # A late append with the old session object does not bring it back.
    with pytest.raises(SessionNotFoundError):
        await service.append_event(session, _event(2, {"z": 3}))
    assert await service.get_session(app_name=app, user_id=user_id, session_id="d") is None


async def test_bad_input(client: AsyncStateClient, user_id: str, app: str) -> None:
    service = AgentStateSessionService(client)
    with pytest.raises(ValueError, match="app_name"):
        await service.create_session(app_name="", user_id=user_id)
    with pytest.raises(ValueError, match="user_id"):
        await service.get_session(app_name=app, user_id="", session_id="s")
    with pytest.raises(ValueError, match="session id"):
        await service.create_session(app_name=app, user_id=user_id, session_id="x" * 300)
    # Across users is an operator's ability, which this service does not allow.
    with pytest.raises(PermissionError, match="STATE_ALLOW_LIST_ALL_USERS"):
        await service.list_sessions(app_name=app)
    with pytest.raises(pydantic.ValidationError):
        GetSessionConfig(num_recent_events=-1)  # ADK's own check, before any call
    # A value JSON cannot hold is stored as its string form, as ADK's persistent services do.
    session = await service.create_session(
        app_name=app, user_id=user_id, session_id="odd", state={"when": object()}
    )
    got = await service.get_session(app_name=app, user_id=user_id, session_id=session.id)
    assert got is not None and isinstance(got.state["when"], str)


async def test_runner_two_turns_with_session_state(
    state_process_address: str, user_id: str, app: str
) -> None:
    """ADK's Runner, two turns, each with a fresh client, service and runner, on a state
    service process: the second turn's model sees the first; state persists across."""
    from tests.support.adk_fakes import adk_turn

    session_id = f"runner-{uuid.uuid4()}"
    first = await adk_turn(state_process_address, app, user_id, session_id, "Where is 88235?")
    assert first["output"] == "turn 1; first question: Where is 88235?"
    second = await adk_turn(state_process_address, app, user_id, session_id, "Cancel it")
    assert second["output"] == "turn 2; first question: Where is 88235?"
    async with AsyncStateClient.connect(state_process_address) as client:
        service = AgentStateSessionService(client)
        session = await service.get_session(app_name=app, user_id=user_id, session_id=session_id)
        assert session is not None
        assert session.state["user:turns"] == 2
        assert session.state["topic"] == "orders"
        assert session.state["last_reply"] == second["output"]
        assert "temp:scratch" not in session.state
        authors = [e.author for e in session.events]
        assert authors == ["user", "assistant", "user", "assistant"]
