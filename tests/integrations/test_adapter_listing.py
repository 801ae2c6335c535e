"""The adapters on the server-side listing (issue 23): ADK's list_sessions is one
ListConversations call per page (with each session's state in it), across users when the
service allows it; LangGraph's list(None) / alist(None) go across the user's threads."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from agentstate.client import convert as ops
from agentstate.client.aio import AsyncStateClient
from agentstate.common.grpc_server import bind, create_server
from agentstate.integrations.adk import AgentStateSessionService
from agentstate.integrations.langgraph import AgentStateSaver
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service.servicer import StateServicer
from agentstate.state_service.storage.base import StateStore
from tests.conftest import TEST_MAX_PAYLOAD_BYTES


@pytest.fixture
async def operator_address(store: StateStore) -> AsyncIterator[str]:
    """A state service that allows listing across users (STATE_ALLOW_LIST_ALL_USERS=on)."""
    server = create_server(max_message_bytes=4 * TEST_MAX_PAYLOAD_BYTES)
    pb_grpc.add_StateServiceServicer_to_server(
        StateServicer(store, max_payload_bytes=TEST_MAX_PAYLOAD_BYTES, allow_list_all_users=True),
        server,
    )
    address = bind(server, "127.0.0.1:0")
    await server.start()
    yield address
    await server.stop(None)


def count_calls(client: AsyncStateClient) -> list[str]:
    """The RPCs the client makes from now on, in order."""
    calls: list[str] = []
    real: Callable[[ops.Op[Any], float | None], Awaitable[Any]] = client._call

    async def counted(op: ops.Op[Any], budget: float | None) -> Any:
        calls.append(op.method)
        return await real(op, budget)

    client._call = counted  # type: ignore[method-assign,assignment]
    return calls


async def test_adk_list_sessions_is_one_call_per_page(
    operator_address: str, user_id: str, other_user_id: str
) -> None:
    app = f"shop-{uuid.uuid4().hex[:8]}"
    async with AsyncStateClient.connect(operator_address) as client:
        service = AgentStateSessionService(client)
        for who in (user_id, other_user_id):
            for n in range(3):
                await service.create_session(
                    app_name=app,
                    user_id=who,
                    session_id=f"s{n}",
                    state={"n": n, "user:who": who, "app:motd": "hi"},
                )
        await service.create_session(app_name=f"{app}-other", user_id=user_id, session_id="x")

        calls = count_calls(client)
        mine = await service.list_sessions(app_name=app, user_id=user_id)
        assert calls == ["ListConversations", "GetScopedState"]
        assert sorted(s.id for s in mine.sessions) == ["s0", "s1", "s2"]
        for session in mine.sessions:
            assert session.state == {
                "n": int(session.id[1]),
                "user:who": user_id,
                "app:motd": "hi",
            }
            assert session.user_id == user_id and session.events == []

        calls.clear()
        everyone = await service.list_sessions(app_name=app)
        assert calls == ["ListConversations", "GetScopedState", "GetScopedState"]
        assert sorted((s.user_id, s.id) for s in everyone.sessions) == sorted(
            (who, f"s{n}") for who in (user_id, other_user_id) for n in range(3)
        )
        assert all(s.state["user:who"] == s.user_id for s in everyone.sessions)


async def _put(saver: AgentStateSaver, thread: str, n: int) -> None:
    checkpoint = empty_checkpoint()
    await saver.aput(
        {"configurable": {"thread_id": thread, "checkpoint_ns": ""}},
        checkpoint,
        {"step": n, "source": "loop"},
        {},
    )


async def test_langgraph_list_none_goes_across_threads(state_address: str) -> None:
    user = f"lg-{uuid.uuid4()}"
    saver = AgentStateSaver(state_address, user_id=user)
    try:
        for thread in ("t1", "t2"):
            for n in range(2):
                await _put(saver, thread, n)

        def sync_list(**kwargs: Any) -> list[Any]:  # the sync twin, off the server's loop
            return list(saver.list(None, **kwargs))

        everything = await asyncio.to_thread(sync_list)
        assert sorted(t.config["configurable"]["thread_id"] for t in everything) == [
            "t1",
            "t1",
            "t2",
            "t2",
        ]
        assert len(await asyncio.to_thread(sync_list, limit=3)) == 3
        filtered = await asyncio.to_thread(sync_list, filter={"step": 1})
        assert [t.metadata["step"] for t in filtered] == [1, 1]
        collected = [t async for t in saver.alist(None)]
        assert len(collected) == 4
        # A config without a thread_id: the config's user's threads.
        other = [t async for t in saver.alist({"configurable": {"user_id": f"{user}-x"}})]
        assert other == []
    finally:
        await saver.aclose()


async def test_the_client_sets_labels_and_time_to_live(state_address: str, user_id: str) -> None:
    """What an adapter passes on (a session option, a checkpointer config) reaches the
    conversation: labels and a time to live at create or resolve, changed later."""
    async with AsyncStateClient.connect(state_address) as client:
        made = await client.create_conversation(
            user_id, "t", labels={"app": "shop"}, ttl_seconds=60
        )
        assert made.labels == {"app": "shop"} and made.ttl_seconds == 60
        assert made.expire_time is not None and not made.ttl_renewed_by_writes
        resolved = await client.resolve_conversation(
            user_id, "k", ttl_seconds=30, ttl_renewed_by_writes=True
        )
        assert resolved.created and resolved.conversation.ttl_renewed_by_writes
        changed = await client.update_conversation(
            user_id, made.conversation_id, set_labels={"tier": "gold"}, clear_ttl=True
        )
        assert changed.labels == {"app": "shop", "tier": "gold"} and changed.ttl_seconds == 0
        found = await client.search_conversations(
            user_id, label_selector="tier=gold", include_total=True
        )
        assert [c.conversation_id for c in found.items] == [made.conversation_id]
        assert found.total_count == 1
