"""agentstate.client against a real state service: the async client on both stores (in
this process), the sync client on a state service process; typed exceptions, deadlines,
retries of reads only, closing."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import grpc
import orjson
import pytest

from agentstate.client import (
    AsyncStateClient,
    CardPending,
    ClientSettings,
    CompactionNote,
    DeadlineExceeded,
    LeaseHeld,
    LeaseLost,
    MessageRole,
    MessageStatus,
    MessageStatusMismatch,
    MessageUpdate,
    NewMessage,
    NoOpenCard,
    NotFound,
    StateClient,
    StateError,
    TurnRequest,
    Unavailable,
    VersionConflict,
)
from agentstate.state_service.storage.postgres import PostgresStore
from tests.support.fault_injection import Blips, state_service_with_blips

SERVICE = "agentstate.state.v1.StateService"


@pytest.fixture
async def client(state_address: str) -> AsyncIterator[AsyncStateClient]:
    async with AsyncStateClient.connect(state_address) as client:
        yield client


async def test_state_round_trip_and_version_conflict(
    client: AsyncStateClient, user_id: str
) -> None:
    cid = (await client.create_conversation(user_id, "t")).conversation_id
    assert await client.find_state(user_id, cid) is None
    with pytest.raises(NotFound) as no_state:
        await client.get_state(user_id, cid)
    assert no_state.value.missing == "state" and no_state.value.reason == "NOT_FOUND"

    saved = await client.upsert_state(user_id, cid, {"turn": 1}, expected_version=0)
    assert saved.version == 1
    saved = await client.upsert_state(user_id, cid, b'{"turn": 2}', expected_version=1)
    snapshot = await client.get_state(user_id, cid)
    assert (snapshot.version, orjson.loads(snapshot.payload)) == (2, {"turn": 2})

    with pytest.raises(VersionConflict) as stale:
        await client.upsert_state(user_id, cid, {"turn": 3}, expected_version=1)
    assert stale.value.current_version == 2 == snapshot.version
    assert stale.value.expected_version == 1
    assert stale.value.code == grpc.StatusCode.ABORTED
    with pytest.raises(VersionConflict) as create_only:
        await client.upsert_state(user_id, cid, {"turn": 3}, expected_version=0)
    assert create_only.value.current_version == 2
    assert (await client.upsert_state(user_id, cid, {"turn": 3})).version == 3  # absent: any

    with pytest.raises(NotFound) as gone:
        await client.get_state(user_id, "42")
    assert gone.value.missing == "conversation"
    with pytest.raises(NotFound):
        await client.find_state(user_id, "42")


async def test_messages_compactions_and_deletes(client: AsyncStateClient, user_id: str) -> None:
    cid = (await client.create_conversation(user_id)).conversation_id
    first = await client.append_message(
        user_id, cid, NewMessage(MessageRole.USER, [{"type": "text", "text": "hi"}])
    )
    saved = await client.upsert_state(
        user_id,
        cid,
        {"context": []},
        writes=[NewMessage(MessageRole.ASSISTANT, status=MessageStatus.STREAMING)],
        compactions=[CompactionNote(10, 3, 900, 200, 120, "test")],
    )
    (reply,) = saved.records
    updated = await client.update_message(
        user_id,
        cid,
        MessageUpdate(
            reply.message_id, MessageStatus.NORMAL, expected_status=MessageStatus.STREAMING
        ),
    )
    assert updated.status is MessageStatus.NORMAL
    with pytest.raises(MessageStatusMismatch):
        await client.update_message(
            user_id,
            cid,
            MessageUpdate(
                reply.message_id, MessageStatus.ERROR, expected_status=MessageStatus.STREAMING
            ),
        )
    page = await client.list_messages(user_id, cid, page_size=1)
    assert [m.message_id for m in page.items] == [first.message_id] and page.next_page_token
    rest = await client.list_messages(user_id, cid, page_token=page.next_page_token)
    assert [m.message_id for m in rest.items] == [reply.message_id]
    newest = await client.list_messages(user_id, cid, page_size=1, newest_first=True)
    assert [m.message_id for m in newest.items] == [reply.message_id]
    older = await client.list_messages(
        user_id, cid, page_token=newest.next_page_token, newest_first=True
    )
    assert [m.message_id for m in older.items] == [first.message_id]
    assert not older.next_page_token
    assert orjson.loads((await client.get_message(user_id, cid, first.message_id)).blocks_json)
    (compaction,) = await client.list_compactions(user_id, cid)
    assert compaction.note.reason == "test" and compaction.create_time is not None

    renamed = await client.rename_conversation(user_id, cid, "renamed")
    assert renamed.title == "renamed"
    other = (await client.create_conversation(user_id)).conversation_id
    deleted = await client.delete_conversation(user_id, cid)
    assert (deleted.conversations, deleted.messages, deleted.states) == (1, 2, 1)
    with pytest.raises(NotFound):
        await client.delete_conversations(user_id, [other, cid])
    assert (await client.delete_conversations(user_id, [other])).conversations == 1


async def test_leases_and_turns(client: AsyncStateClient, user_id: str) -> None:
    begun = await client.begin_turn(
        TurnRequest(
            user_id=user_id,
            conversation_id="",
            holder="replica-1",
            ttl_ms=60_000,
            new_records=(NewMessage(MessageRole.USER), NewMessage(MessageRole.ASSISTANT)),
            guard=NoOpenCard(),
        )
    )
    assert begun.conversation_created and begun.state is None and begun.version == 0
    assert len(begun.records) == 2
    cid = begun.conversation_id
    with pytest.raises(LeaseHeld):
        await client.acquire_lease(user_id, cid, holder="replica-2", ttl_ms=60_000)
    renewed = await client.renew_lease(user_id, begun.task_id, 60_000)
    assert renewed.task_id == begun.task_id and not renewed.stop_requested
    assert (await client.request_stop(user_id, begun.task_id)).stop_requested
    card = MessageUpdate(
        begun.records[1].message_id, MessageStatus.AWAITING_CONFIRM, metadata={"confirm": {}}
    )
    ended = await client.end_turn(
        user_id, cid, begun.task_id, payload={"n": 1}, expected_version=0, writes=[card]
    )
    assert ended.version == 1 and ended.lease_released
    with pytest.raises(LeaseLost):
        await client.renew_lease(user_id, begun.task_id, 60_000)
    assert not await client.release_lease(user_id, begun.task_id)

    with pytest.raises(CardPending) as pending:
        await client.begin_turn(
            TurnRequest(user_id, cid, holder="h", ttl_ms=1000, guard=NoOpenCard())
        )
    assert pending.value.awaiting_message_id == begun.records[1].message_id
    acquired = await client.acquire_lease(user_id, cid, holder="h", ttl_ms=60_000)
    assert acquired.lapsed_task_id == "" and acquired.lease.holder == "h"
    held = await client.get_lease(user_id, cid)
    assert held is not None and held.task_id == acquired.lease.task_id and held.holder == "h"
    assert held.acquire_time is not None and held.acquire_time <= held.expire_time
    assert await client.release_lease(user_id, acquired.lease.task_id)
    assert await client.get_lease(user_id, cid) is None
    with pytest.raises(NotFound) as absent:
        await client.get_lease("someone-else", cid)
    assert absent.value.missing == "conversation"


@pytest.fixture
async def slow_address() -> AsyncIterator[str]:
    """A StateService whose ListConversations answers after 2 s."""

    async def slow(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        await asyncio.sleep(2)
        return b""

    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(slow)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"ListConversations": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(None)


async def test_deadline_exceeded_is_typed(slow_address: str, user_id: str) -> None:
    async with AsyncStateClient.connect(slow_address, timeout_seconds=0.2) as client:
        with pytest.raises(DeadlineExceeded) as late:
            await client.list_conversations(user_id)  # the client's default deadline
        assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and late.value.reason == ""
        assert isinstance(late.value, StateError)

    def sync_call() -> None:
        with StateClient.connect(slow_address, timeout_seconds=30) as sync_client:
            sync_client.list_conversations(user_id, timeout=0.2)  # per call

    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        await asyncio.to_thread(sync_call)  # the server runs on this loop
    assert time.monotonic() - started < 1.5


async def test_reads_are_retried_and_writes_are_not(pg_store: PostgresStore, user_id: str) -> None:
    blips: Blips
    async with (
        state_service_with_blips(pg_store) as (blips, address),
        AsyncStateClient.connect(address) as client,
    ):
        cid = (await client.create_conversation(user_id)).conversation_id
        blips.failures, blips.attempts = 2, Counter()
        assert (await client.get_conversation(user_id, cid)).conversation_id == cid
        assert blips.attempts["GetConversation"] == 3  # two blips, then the answer
        with pytest.raises(Unavailable):
            await client.rename_conversation(user_id, cid, "t")
        assert blips.attempts["RenameConversation"] == 1  # a write is never replayed


async def test_closing_closes_the_channel(state_address: str, user_id: str) -> None:
    client = AsyncStateClient.connect(state_address)
    async with client:
        await client.list_conversations(user_id)
    with pytest.raises(grpc.aio.UsageError, match="Channel is closed"):
        await client.list_conversations(user_id)


def test_sync_client_on_a_state_process(state_process_address: str, user_id: str) -> None:
    settings = ClientSettings.from_env(
        {
            "AGENTSTATE_STATE_ADDRESS": state_process_address,
            "AGENTSTATE_STATE_TIMEOUT_SECONDS": "5",
        }
    )
    with StateClient.from_settings(settings) as client:
        resolved = client.resolve_conversation(user_id, "sync-thread")
        cid = resolved.conversation.conversation_id
        assert resolved.created
        assert client.upsert_state(user_id, cid, {"a": 1}, expected_version=0).version == 1
        with pytest.raises(VersionConflict) as stale:
            client.upsert_state(user_id, cid, {"a": 2}, expected_version=0)
        assert stale.value.current_version == 1
        with pytest.raises(NotFound) as absent:
            client.get_message(user_id, cid, "1")
        assert absent.value.missing == "message"
        assert client.find_state(user_id, cid) is not None
        assert client.get_lease(user_id, cid) is None
        assert client.delete_conversation(user_id, cid).states == 1
    with pytest.raises(ValueError, match="Cannot invoke RPC on closed channel"):
        client.get_state(user_id, cid)
