"""EraseUser (issue 23): every row of one user in every table goes, other users' rows stay
(read from the tables themselves), in batches, resumable, idempotent, with a receipt that
holds no user content, and no late write brings anything back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import grpc
import psycopg
import pytest

from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service import domain as d
from agentstate.state_service.domain import MessageRole, NewMessage
from agentstate.state_service.storage.base import StateStore
from agentstate.state_service.storage.base.lifecycle import EraseSettings
from agentstate.state_service.storage.postgres import PostgresStore
from agentstate.state_service.storage.postgres import lifecycle_sql as lsql
from tests.state_service.test_error_details import error_info
from tests.support.helpers import expect_rpc_error
from tests.support.state_process import run_command

FAST = EraseSettings(batch_conversations=3, pause_seconds=0, stop_grace_seconds=0.2)

# Every table that holds a user's rows, with its user column.
USER_TABLES = {
    "t_conversation": "user_id",
    "t_agent_message": "user_id",
    "t_agent_state": "user_id",
    "t_agent_state_message": "user_id",
    "t_run_lease": "user_id",
    "t_context_compaction": "user_id",
    "t_checkpoint": "user_id",
    "t_checkpoint_blob": "user_id",
    "t_checkpoint_write": "user_id",
    "t_conversation_item": "user_id",
    "t_scoped_state": "user_id",
    "t_erasure_fence": "user_id",
    "t_conversation_label": "user_id",
}


async def fill(store: StateStore, user_id: str, conversations: int = 7) -> list[int]:
    """A user with a row of every kind: states with context, records, compactions, a
    lease, checkpoints with channel values and writes, items, user-scoped state."""
    ids = []
    for n in range(conversations):
        cid = (
            await store.create_conversation(
                user_id=user_id, title=f"c{n}", external_key=f"adk:shop:{n}", labels={"n": "x"}
            )
        ).conversation_id
        ids.append(cid)
        await store.save_state(
            user_id=user_id,
            conversation_id=cid,
            state_key="agent_state",
            payload=json.dumps({"context": [{"m": 1}, {"m": 2}], "cur_iter": n}).encode(),
            expected_version=None,
            message_writes=[
                NewMessage(MessageRole.USER, b'[{"type": "text", "text": "secret"}]'),
                NewMessage(MessageRole.ASSISTANT, b'[{"type": "text", "text": "ok"}]'),
            ],
            compactions=[d.Compaction(4, 2, 100, 50, 10, "test")],
        )
        await store.append_event(  # type: ignore[attr-defined]
            user_id=user_id,
            conversation_id=cid,
            event=d.EventAppend(
                item=d.NewItem(b'{"event": 1}'),
                expected_revision=None,
                app_name="shop",
                user_delta=d.state_delta(b'{"likes": "watches"}', 10_000, "user_delta"),
                app_delta=d.state_delta(b'{"shared": 1}', 10_000, "app_delta"),
            ),
        )
        await store.put_checkpoint(  # type: ignore[attr-defined]
            user_id=user_id,
            conversation_id=cid,
            checkpoint=d.NewCheckpoint(
                namespace="",
                checkpoint_id=f"cp{n}",
                parent_checkpoint_id=None,
                checkpoint_type="json",
                checkpoint=b"{}",
                metadata_json=b"{}",
                channel_versions={"messages": "1"},
                new_values=(d.ChannelValue("messages", "1", "json", b"[]"),),
            ),
            expected_head=None,
        )
        await store.put_checkpoint_writes(  # type: ignore[attr-defined]
            user_id=user_id,
            conversation_id=cid,
            namespace="",
            checkpoint_id=f"cp{n}",
            writes=[d.CheckpointWrite("task", 0, "messages", "json", b"[]")],
        )
    await store.acquire_lease(
        user_id=user_id, conversation_id=ids[-1], holder="h", ttl_ms=60_000, max_user_leases=0
    )
    return ids


async def table_counts(database_url: str, user_id: str) -> dict[str, int]:
    """The user's rows in every table, read directly."""
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        counts = {}
        for table, column in USER_TABLES.items():
            cur = await conn.execute(
                f"SELECT count(*) FROM {table} WHERE {column} = %s",
                (user_id,),
            )
            row = await cur.fetchone()
            assert row is not None
            counts[table] = int(row[0])
        return counts


async def test_erase_removes_every_row_and_only_the_users(
    store: StateStore, user_id: str, other_user_id: str, database_url: str
) -> None:
    await fill(store, user_id)
    await fill(store, other_user_id, conversations=2)
    other_before = None
    if isinstance(store, PostgresStore):
        other_before = await table_counts(database_url, other_user_id)
        mine = await table_counts(database_url, user_id)
        assert all(mine[t] > 0 for t in USER_TABLES if t != "t_erasure_fence"), mine

    receipt = await store.erase_user(user_id=user_id, settings=FAST)

    assert receipt.done and receipt.end_time is not None
    assert receipt.start_time <= receipt.end_time
    assert receipt.counts["conversations"] == 7
    assert receipt.counts["messages"] == 14
    assert receipt.counts["states"] == 7
    assert receipt.counts["state_messages"] == 14
    assert receipt.counts["leases"] == 1
    assert receipt.counts["compactions"] == 7
    assert receipt.counts["checkpoints"] == 7
    assert receipt.counts["channel_values"] == 7
    assert receipt.counts["checkpoint_writes"] == 7
    assert receipt.counts["items"] == 7
    assert receipt.counts["scoped_states"] == 1  # the user's; the app's stays
    # Fetchable later, the same receipt, with no user content and no user id.
    assert await store.get_erasure_receipt(erasure_id=receipt.erasure_id) == receipt
    assert user_id not in repr(receipt) and "secret" not in repr(receipt)

    listed = await store.list_conversations(user_id=user_id, page_size=10, before_id=None)
    assert listed.items == []
    scoped = await store.get_scoped_state(user_id=user_id, app_name="shop")  # type: ignore[attr-defined]
    assert scoped.user is None and scoped.app is not None  # app-scoped state is not the user's
    others = await store.list_conversations(user_id=other_user_id, page_size=10, before_id=None)
    assert len(others.items) == 2
    if isinstance(store, PostgresStore):
        assert set((await table_counts(database_url, user_id)).values()) == {0}
        assert await table_counts(database_url, other_user_id) == other_before
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM t_erasure WHERE counts::text LIKE %s OR user_hash = %s",
                (f"%{user_id}%", user_id),
            )
            assert (await cur.fetchone()) == (0,)  # the receipt table names nobody

    # Idempotent: erasing again returns the same receipt, and changes nothing.
    again = await store.erase_user(user_id=user_id, settings=FAST)
    assert again == receipt


async def test_unknown_user_and_unknown_receipt(store: StateStore, user_id: str) -> None:
    with pytest.raises(d.NotFound, match="no data to erase"):
        await store.erase_user(user_id=user_id, settings=FAST)
    with pytest.raises(d.NotFound, match="no erasure has the id 42"):
        await store.get_erasure_receipt(erasure_id=42)


async def test_no_new_row_while_an_erase_runs_and_running_erase_is_refused(
    store: StateStore, user_id: str
) -> None:
    """While a user's erase runs (here: one left by a crashed call), nothing new of the
    user is accepted, a second erase is refused, and after it goes stale it resumes."""
    ids = await fill(store, user_id, conversations=4)
    stalled = EraseSettings(batch_conversations=1, stale_seconds=1.0)
    erasure_id = await start_erasure_and_crash(store, user_id, stalled)

    with pytest.raises(d.UserBeingErased, match=f"receipt {erasure_id}"):
        await store.create_conversation(user_id=user_id, title="late")
    with pytest.raises(d.UserBeingErased):
        await store.resolve_conversation(
            user_id=user_id, external_key="new", create_if_missing=True, title="t"
        )
    with pytest.raises(d.ErasureRunning, match=f"receipt {erasure_id}"):
        await store.erase_user(user_id=user_id, settings=stalled)
    # A running turn was asked to stop.
    lease = await store.get_lease(user_id=user_id, conversation_id=ids[-1])
    assert lease is not None and lease.stop_requested

    await asyncio.sleep(1.1)  # the crashed call's heartbeat goes stale
    receipt = await store.erase_user(user_id=user_id, settings=stalled)
    assert receipt.erasure_id == erasure_id and receipt.done
    assert receipt.counts["conversations"] == 4  # the batch before the crash counts too
    # Done: the user may start again, with new rows.
    await store.create_conversation(user_id=user_id, title="a new start")


async def start_erasure_and_crash(store: StateStore, user_id: str, settings: EraseSettings) -> int:
    """Begin an erase and run one batch of it, as a call that then died would have."""
    if isinstance(store, PostgresStore):
        (row,) = await store._rows(
            lsql.ERASE_BEGIN,
            {"user_id": user_id, "user_hash": d.user_hash(user_id), "stale_ms": 1000},
        )
        erasure_id = int(row["erasure_id"])
        await store._rows(
            lsql.ERASE_BATCH, {"user_id": user_id, "erasure_id": erasure_id, "batch": 1}
        )
        return erasure_id
    from agentstate.state_service.storage.memory import MemoryStore

    assert isinstance(store, MemoryStore)
    async with store._lock:
        erasure_id = store._begin_erasure(user_id, d.user_hash(user_id), settings)
        store._erase_batch(user_id, erasure_id, 1)
    return erasure_id


async def test_no_late_write_brings_anything_back(
    store: StateStore, user_id: str, database_url: str
) -> None:
    """Writers keep writing to the user's conversations (and making new ones) while the
    erase runs; afterwards the user has no row anywhere. The race: every write either
    lands before its conversation is erased (and is erased with it) or fails."""
    ids = await fill(store, user_id, conversations=12)
    stop = asyncio.Event()
    outcomes: dict[str, int] = {"ok": 0, "refused": 0}

    async def writer(cid: int) -> None:
        while not stop.is_set():
            try:
                await store.append_message(
                    user_id=user_id,
                    conversation_id=cid,
                    message=NewMessage(MessageRole.USER, b'[{"type": "text", "text": "x"}]'),
                )
                outcomes["ok"] += 1
            except (d.NotFound, d.UserBeingErased):
                outcomes["refused"] += 1
            await asyncio.sleep(0)

    async def creator() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            with contextlib.suppress(d.UserBeingErased):
                await store.resolve_conversation(
                    user_id=user_id, external_key=f"late-{n}", create_if_missing=True, title="t"
                )
            await asyncio.sleep(0.001)

    tasks = [asyncio.create_task(writer(cid)) for cid in ids]
    tasks.append(asyncio.create_task(creator()))
    await asyncio.sleep(0.05)
    receipt = await store.erase_user(
        user_id=user_id, settings=EraseSettings(batch_conversations=2, stop_grace_seconds=0)
    )
    stop.set()
    await asyncio.gather(*tasks)
    assert receipt.done and outcomes["refused"] > 0
    # Nothing of the user survived from before the end of the erase: only conversations
    # the creator made after it (new data) may exist, and no message of the old ones.
    left = await store.list_conversations(user_id=user_id, page_size=500, before_id=None)
    assert all(c.conversation_id not in ids for c in left.items)
    assert all(c.create_time >= receipt.end_time for c in left.items if receipt.end_time)
    if isinstance(store, PostgresStore):
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM t_agent_message WHERE user_id = %s "
                "AND conversation_id = ANY(%s)",
                (user_id, ids),
            )
            assert (await cur.fetchone()) == (0,)


async def test_erase_user_rpc_with_refusals_and_audit_line(
    state_stub: pb_grpc.StateServiceAsyncStub,
    user_id: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    error = await expect_rpc_error(
        state_stub.EraseUser(pb.EraseUserRequest(user_id="")), grpc.StatusCode.INVALID_ARGUMENT
    )
    error = await expect_rpc_error(
        state_stub.EraseUser(pb.EraseUserRequest(user_id=user_id)),
        grpc.StatusCode.NOT_FOUND,
        "no data to erase",
    )
    assert error_info(error) == ("NOT_FOUND", {"missing": "user"})
    await expect_rpc_error(
        state_stub.GetErasureReceipt(pb.GetErasureReceiptRequest(erasure_id="x")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "erasure_id",
    )
    await expect_rpc_error(
        state_stub.GetErasureReceipt(pb.GetErasureReceiptRequest(erasure_id="7")),
        grpc.StatusCode.NOT_FOUND,
        "no erasure",
    )
    created = await state_stub.CreateConversation(
        pb.CreateConversationRequest(user_id=user_id, title="secret title")
    )
    with caplog.at_level(logging.INFO, logger="agentstate.audit"):
        erased = await state_stub.EraseUser(pb.EraseUserRequest(user_id=user_id))
    receipt = erased.receipt
    assert receipt.state == pb.ERASURE_STATE_DONE
    assert receipt.counts["conversations"] == 1 and receipt.HasField("end_time")
    audit = [r.getMessage() for r in caplog.records if r.name == "agentstate.audit"]
    assert len(audit) == 1 and f"erasure {receipt.erasure_id} done" in audit[0]
    assert user_id not in audit[0] and d.user_hash(user_id) in audit[0]
    fetched = await state_stub.GetErasureReceipt(
        pb.GetErasureReceiptRequest(erasure_id=receipt.erasure_id)
    )
    assert fetched.receipt == receipt
    assert b"secret" not in fetched.SerializeToString()
    assert user_id.encode() not in fetched.SerializeToString()
    await expect_rpc_error(
        state_stub.GetConversation(
            pb.GetConversationRequest(
                user_id=user_id, conversation_id=created.conversation.conversation_id
            )
        ),
        grpc.StatusCode.NOT_FOUND,
    )


async def test_writes_during_an_erase_are_refused_over_grpc(
    state_stub: pb_grpc.StateServiceAsyncStub, store: StateStore, user_id: str
) -> None:
    await fill(store, user_id, conversations=2)
    erasure_id = await start_erasure_and_crash(store, user_id, EraseSettings())
    error = await expect_rpc_error(
        state_stub.CreateConversation(pb.CreateConversationRequest(user_id=user_id)),
        grpc.StatusCode.FAILED_PRECONDITION,
        f"being erased (receipt {erasure_id})",
    )
    assert error_info(error) == ("USER_BEING_ERASED", {})
    # A turn that would start a new conversation, and new user-scoped state, too.
    await expect_rpc_error(
        state_stub.BeginTurn(
            pb.BeginTurnRequest(user_id=user_id, holder="replica-1", ttl_ms=30_000)
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "being erased",
    )
    error = await expect_rpc_error(
        state_stub.EraseUser(pb.EraseUserRequest(user_id=user_id)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "already running",
    )
    assert error_info(error) == ("ERASURE_RUNNING", {})


def test_erase_user_admin_command(database_url: str, user_id: str) -> None:
    async def seed() -> None:
        pg = PostgresStore(database_url, min_size=1, max_size=2)
        await pg.open()
        try:
            await fill(pg, user_id, conversations=2)
        finally:
            await pg.close()

    asyncio.run(seed())
    env = {"STATE_STORE": "postgres", "DATABASE_URL": database_url}
    done = run_command(env, "erase-user", user_id)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("erased: receipt ")
    assert "conversations 2" in lines and "messages 4" in lines
    assert "agentstate.audit" in done.stderr or "erasure" in done.stderr
    assert user_id not in done.stdout + done.stderr
    again = run_command(env, "erase-user", user_id)
    assert again.returncode == 0 and again.stdout.splitlines()[0] == lines[0]  # idempotent
    unknown = run_command(env, "erase-user", f"{user_id}-never")
    assert unknown.returncode == 2 and "no data to erase" in unknown.stderr
    missing = run_command(env, "erase-user")
    assert missing.returncode == 2 and "erase-user needs a USER" in missing.stderr
