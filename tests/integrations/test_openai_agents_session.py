"""The OpenAI Agents SDK Session on the state service (agentstate.integrations.openai_agents).

Same operations, same results as the SDK's SQLiteSession; add_items from two processes
at once lose nothing; Runner.run over two turns in two processes shares one session; the
items go with the conversation; bad input gets the SDK's errors, not gRPC's.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agents import SQLiteSession
from agents.memory.session_settings import SessionSettings

from agentstate.client.aio import AsyncStateClient
from agentstate.integrations.openai_agents import AgentStateSession, session_key
from tests.support import paths

ROOT = paths.REPO


@pytest.fixture
async def client(state_address: str) -> AsyncIterator[AsyncStateClient]:
    async with AsyncStateClient.connect(state_address) as connected:
        yield connected


def _item(n: int, role: str = "user") -> Any:
    return {"role": role, "content": f"message {n} 你好"}


async def test_same_results_as_sqlite_session(client: AsyncStateClient, user_id: str) -> None:
    ours = AgentStateSession("conformance", client=client, user_id=user_id)
    theirs = SQLiteSession("conformance")
    steps: list[tuple[str, Any]] = [
        ("get", None),
        ("pop", None),
        ("add", [_item(0), _item(1, "assistant"), _item(2)]),
        ("get", None),
        ("get", 2),
        ("get", 0),
        ("get", 10),
        ("get", -1),
        ("add", [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]),
        ("add", []),
        ("pop", None),
        ("get", 1),
        ("add", [_item(3)]),
        ("get", None),
        ("clear", None),
        ("get", None),
        ("pop", None),
        ("add", [_item(4)]),
        ("get", None),
    ]
    for step, (op, arg) in enumerate(steps):
        results: list[Any] = []
        sessions: tuple[Any, Any] = (theirs, ours)
        for session in sessions:
            if op == "get":
                results.append(await session.get_items(arg))
            elif op == "add":
                results.append(await session.add_items(arg))
            elif op == "pop":
                results.append(await session.pop_item())
            else:
                results.append(await session.clear_session())
        assert results[1] == results[0], f"step {step} {op}({arg})"
    theirs.close()


async def test_a_session_reads_only_what_came_since(
    client: AsyncStateClient, user_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session keeps the items it has read and then reads only the items since; what
    another process pops, clears or adds in between, it still sees (as SQLiteSession)."""
    ours = AgentStateSession("since", client=client, user_id=user_id)
    elsewhere = AgentStateSession("since", client=client, user_id=user_id)  # another process
    theirs = SQLiteSession("since")
    read: list[int] = []  # the items each ListItems call carried
    list_items = client.list_items

    async def counted(*args: Any, **kwargs: Any) -> Any:
        page = await list_items(*args, **kwargs)
        read.append(len(page.items))
        return page

    monkeypatch.setattr(client, "list_items", counted)

    async def both(session: AgentStateSession, call: str, *args: Any) -> None:
        assert await getattr(session, call)(*args) == await getattr(theirs, call)(*args)

    async def get(carried: list[int], limit: int | None = None) -> None:
        read.clear()
        await both(ours, "get_items", limit)
        assert read == carried

    await both(ours, "add_items", [_item(0), _item(1), _item(2)])
    await get([3])  # the first read reads everything
    await get([0])  # nothing came since
    await both(ours, "add_items", [_item(3)])
    await get([0], 2)  # its own append is kept
    await both(elsewhere, "add_items", [_item(4), _item(5)])
    await get([2])  # only the two added elsewhere
    await both(elsewhere, "pop_item")
    await get([0, 5])  # a pop elsewhere: read again, all of it
    await both(elsewhere, "pop_item")
    await both(elsewhere, "add_items", [_item(6)])
    await get([1, 5])  # a pop and an add: the add alone does not account for the change
    await both(elsewhere, "clear_session")
    await get([])  # the conversation is gone (NOT_FOUND): empty
    await both(elsewhere, "add_items", [_item(7)])
    await get([1])  # the new conversation under the same key
    await both(ours, "pop_item")
    await get([0])
    theirs.close()


async def test_session_settings_limit(client: AsyncStateClient, user_id: str) -> None:
    session = AgentStateSession(
        "limited", client=client, user_id=user_id, session_settings=SessionSettings(limit=2)
    )
    await session.add_items([_item(n) for n in range(5)])
    assert await session.get_items() == [_item(3), _item(4)]
    assert len(await session.get_items(4)) == 4


async def test_long_session_pages(client: AsyncStateClient, user_id: str) -> None:
    """More items than one AppendItems call or one ListItems page hold."""
    session = AgentStateSession("long", client=client, user_id=user_id)
    items = [_item(n) for n in range(1205)]
    await session.add_items(items)
    assert await session.get_items() == items
    assert await session.get_items(1001) == items[-1001:]


async def test_items_go_with_the_conversation(client: AsyncStateClient, user_id: str) -> None:
    session = AgentStateSession("deleted", client=client, user_id=user_id)
    await session.add_items([_item(1), _item(2)])
    conversation_id = await session.conversation_id()
    assert conversation_id is not None
    deleted = await client.delete_conversation(user_id, conversation_id)
    assert deleted.conversations == 1
    # A session whose conversation was deleted elsewhere is empty, as a new SQLiteSession.
    assert await session.get_items() == []
    assert await session.pop_item() is None
    # Its next items start a new conversation under the same key; the old ones never return.
    await session.add_items([_item(3)])
    assert await session.get_items() == [_item(3)]
    assert await session.conversation_id() != conversation_id
    resolved = await client.resolve_conversation(user_id, session_key("deleted"), create=False)
    assert resolved.conversation.conversation_id == await session.conversation_id()


async def test_a_session_cleared_and_restarted_elsewhere_reads_the_new_items(
    client: AsyncStateClient, user_id: str
) -> None:
    """Two session objects of one id: one clears it and adds again (a new conversation
    under the key). The other, which knew the old conversation, reads and pops the new
    items, as two SQLiteSession objects of one id share its rows."""
    here = AgentStateSession("restarted", client=client, user_id=user_id)
    there = AgentStateSession("restarted", client=client, user_id=user_id)
    await there.add_items([_item(1)])
    old = await there.conversation_id()
    await here.clear_session()
    await here.add_items([_item(2), _item(3)])
    assert await here.conversation_id() != old
    assert await there.get_items() == [_item(2), _item(3)]
    assert await there.conversation_id() == await here.conversation_id()

    # The same for pop_item, from a session that still knows the cleared conversation.
    stale = AgentStateSession("restarted", client=client, user_id=user_id)
    await stale.get_items()
    await here.clear_session()
    await here.add_items([_item(4), _item(5)])
    assert await stale.pop_item() == _item(5)
    assert await here.get_items() == [_item(4)]


async def test_bad_input(client: AsyncStateClient, user_id: str) -> None:
    for bad in ("", "x" * 300, "nul\x00"):
        with pytest.raises(ValueError, match="session_id"):
            AgentStateSession(bad, client=client, user_id=user_id)
    with pytest.raises(ValueError, match="user_id"):
        AgentStateSession("s", client=client, user_id="")
    session: Any = AgentStateSession("bad-items", client=client, user_id=user_id)
    await session.add_items([_item(0)])
    # As json.dumps in SQLiteSession: TypeError for a value JSON cannot hold; nothing stored.
    with pytest.raises(TypeError):
        await session.add_items([_item(1), {"role": "user", "content": object()}])
    # NaN and NUL are stored, as SQLiteSession stores them (test_faithful_adapters.py).
    assert await session.get_items() == [_item(0)]
    # Another user's session of the same id is a different session.
    stranger = AgentStateSession("bad-items", client=client, user_id=f"other-{user_id}")
    assert await stranger.get_items() == []


def _worker(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.framework_workers", *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen[str]) -> Any:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


async def test_add_items_from_two_processes_lose_nothing(
    state_process_address: str, user_id: str
) -> None:
    """This process and a worker process each hold a session object of the same new
    session and add 30 items at the same time, one call per item (the first access races
    too: neither has resolved the conversation before the go)."""
    session_id = f"shared-{uuid.uuid4()}"
    worker = _worker("openai-add", state_process_address, user_id, session_id, "30", "b")
    assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
    async with AsyncStateClient.connect(state_process_address) as client:
        session = AgentStateSession(session_id, client=client, user_id=user_id)
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
        for n in range(30):
            await session.add_items([{"role": "user", "content": f"a-{n}"}])
        assert await asyncio.to_thread(_result, worker) == {"added": 30}
        items: list[Any] = await session.get_items()
        conversation_id = await session.conversation_id()
        resolved = await client.resolve_conversation(user_id, session_key(session_id))
    assert resolved.conversation.conversation_id == conversation_id and not resolved.created
    contents = [item["content"] for item in items]
    assert len(contents) == 60
    for tag in ("a", "b"):
        assert [c for c in contents if c.startswith(tag)] == [f"{tag}-{n}" for n in range(30)]


async def test_runner_two_turns_in_two_processes(state_process_address: str, user_id: str) -> None:
    """Runner.run in this process, then in another one: the second sees the first turn."""
    from tests.support.openai_fakes import openai_turn

    session_id = f"runner-{uuid.uuid4()}"
    first = await openai_turn(state_process_address, user_id, session_id, "Where is order 88235?")
    assert first["output"] == "turn 1; first question: Where is order 88235?"
    second = _result(
        _worker("openai-turn", state_process_address, user_id, session_id, "Cancel it")
    )
    assert second["output"] == "turn 2; first question: Where is order 88235?"
    async with AsyncStateClient.connect(state_process_address) as client:
        items: list[Any] = await AgentStateSession(
            session_id, client=client, user_id=user_id
        ).get_items()
    roles = [item.get("role") for item in items]
    assert roles == ["user", "assistant", "user", "assistant"]
