"""PostgreSQL-only behaviour: transactions under failure and races, migrations, outages."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

import grpc
import psycopg
import pytest

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service import domain as d
from agentstate.state_service.domain import (
    LeaseHeld,
    MessageRole,
    NewMessage,
    NotFound,
    TurnStart,
)
from agentstate.state_service.storage.postgres import PostgresStore, migrations
from agentstate.state_service.storage.postgres.codecs import BigintArray, TextArray
from agentstate.state_service.storage.postgres.migrations import MIGRATIONS, apply_migrations
from tests.conftest import create_database, start_state_server
from tests.support.helpers import (
    all_messages,
    expect_rpc_error,
    get_state,
    new_conversation,
    user_text,
)
from tests.support.source_example import source_state_bytes

Stub: TypeAlias = "pb_grpc.StateServiceAsyncStub"


@pytest.fixture
async def pg_stub(pg_store: PostgresStore) -> AsyncIterator[Stub]:
    server, address = await start_state_server(pg_store)
    async with grpc.aio.insecure_channel(address) as channel:
        yield pb_grpc.StateServiceStub(channel)
    await server.stop(None)


async def _populated(stub: Stub, user_id: str) -> str:
    cid = await new_conversation(stub, user_id)
    await stub.UpsertState(
        pb.UpsertStateRequest(
            user_id=user_id,
            conversation_id=cid,
            payload=source_state_bytes(),
            message_writes=[pb.MessageWrite(insert=user_text(f"m{i}")) for i in range(4)],
        )
    )
    return cid


async def _row_counts(database_url: str, cid: str) -> tuple[int, int, int]:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute(
            """SELECT (SELECT count(*) FROM t_conversation WHERE id = %(id)s),
                      (SELECT count(*) FROM t_agent_message WHERE conversation_id = %(id)s),
                      (SELECT count(*) FROM t_agent_state WHERE session_id = %(id)s)""",
            {"id": int(cid)},
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])


async def _fail_conversation_deletes(database_url: str, cid: str) -> str:
    """Install a trigger that fails the delete of one conversation row, the last
    statement of the delete transaction (after its messages and state are gone)."""
    name = f"fail_delete_{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(
            f"""
            CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF OLD.id = {int(cid)} THEN
                    RAISE EXCEPTION 'injected failure while deleting conversation %', OLD.id;
                END IF;
                RETURN OLD;
            END $$;
            CREATE TRIGGER {name} BEFORE DELETE ON t_conversation
                FOR EACH ROW EXECUTE FUNCTION {name}();
            """.encode()
        )
    return name


async def _drop_trigger(database_url: str, name: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(
            f"DROP TRIGGER {name} ON t_conversation; DROP FUNCTION {name}();".encode()
        )


async def test_failure_inside_delete_keeps_everything(
    pg_stub: Stub, database_url: str, user_id: str
) -> None:
    cid = await _populated(pg_stub, user_id)
    before = await _row_counts(database_url, cid)
    assert before == (1, 4, 1)
    trigger = await _fail_conversation_deletes(database_url, cid)
    try:
        await expect_rpc_error(
            pg_stub.DeleteConversation(
                pb.DeleteConversationRequest(user_id=user_id, conversation_id=cid)
            ),
            grpc.StatusCode.INTERNAL,
            "injected failure",
        )
        other = await _populated(pg_stub, user_id)
        await expect_rpc_error(
            pg_stub.BatchDeleteConversations(
                pb.BatchDeleteConversationsRequest(user_id=user_id, conversation_ids=[other, cid])
            ),
            grpc.StatusCode.INTERNAL,
            "nothing was changed",
        )
    finally:
        await _drop_trigger(database_url, trigger)
    assert await _row_counts(database_url, cid) == before
    assert await _row_counts(database_url, other) == (1, 4, 1)
    assert len(await all_messages(pg_stub, user_id, cid)) == 4
    _, version = await get_state(pg_stub, user_id, cid)
    assert version == 1


async def test_delete_racing_late_writes_never_resurrects(
    pg_stub: Stub, database_url: str, user_id: str
) -> None:
    """Writers and a delete race: once the delete commits, nothing of the conversation remains."""
    for _ in range(5):
        cid = await _populated(pg_stub, user_id)

        async def late_write(i: int, cid: str = cid) -> None:
            try:
                await pg_stub.UpsertState(
                    pb.UpsertStateRequest(
                        user_id=user_id,
                        conversation_id=cid,
                        payload=json.dumps({"late": i}).encode(),
                        message_writes=[pb.MessageWrite(insert=user_text(f"late {i}"))],
                    )
                )
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND, exc.details()

        delete = pg_stub.DeleteConversation(
            pb.DeleteConversationRequest(user_id=user_id, conversation_id=cid)
        )
        writes = [late_write(i) for i in range(10)]
        deleted, *_ = await asyncio.gather(delete, *writes)
        assert deleted is not None and deleted.conversations_deleted == 1
        # Writes that won the race were deleted with it; later ones found nothing.
        assert await _row_counts(database_url, cid) == (0, 0, 0)


async def test_migrations_are_idempotent_and_safe_concurrently(postgres: EmbeddedPostgres) -> None:
    dsn = create_database(postgres, f"migrate_{uuid.uuid4().hex[:8]}")
    conns = [await psycopg.AsyncConnection.connect(dsn) for _ in range(3)]
    try:
        results = await asyncio.gather(*(apply_migrations(c) for c in conns))
        applied = sorted(v for result in results for v in result)
        assert applied == [m.version for m in MIGRATIONS]  # each applied exactly once
        assert await apply_migrations(conns[0]) == []
        cur = await conns[0].execute(
            "SELECT version FROM agentstate_schema_migrations ORDER BY version"
        )
        assert [r[0] for r in await cur.fetchall()] == [m.version for m in MIGRATIONS]
    finally:
        for conn in conns:
            await conn.close()


async def test_database_outage_is_unavailable_then_recovers(world_traversable_dir: Path) -> None:
    server = EmbeddedPostgres(world_traversable_dir / "pgdata")
    dsn = server.start()
    store = PostgresStore(dsn, min_size=1, max_size=2, timeout=2)
    try:
        await store.open()
        grpc_server, address = await start_state_server(store)
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.StateServiceStub(channel)
            cid = await new_conversation(stub, "u")
            await stub.UpsertState(
                pb.UpsertStateRequest(user_id="u", conversation_id=cid, payload=b'{"kept": 1}')
            )
            await asyncio.to_thread(server.stop)
            await expect_rpc_error(
                stub.GetState(pb.GetStateRequest(user_id="u", conversation_id=cid)),
                grpc.StatusCode.UNAVAILABLE,
            )
            await expect_rpc_error(
                stub.UpsertState(
                    pb.UpsertStateRequest(user_id="u", conversation_id=cid, payload=b'{"x": 1}')
                ),
                grpc.StatusCode.UNAVAILABLE,
            )
            await asyncio.to_thread(server.start)
            for _ in range(50):
                try:
                    state, version = await get_state(stub, "u", cid)
                    break
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError("the store did not recover")
            assert (state, version) == ({"kept": 1}, 1)
        await grpc_server.stop(None)
    finally:
        await store.close()
        server.stop()


RACE_ROUNDS = 1500


async def test_delete_racing_turns_leases_and_writes(
    pg_store: PostgresStore, database_url: str, user_id: str
) -> None:
    """Thousands of rounds of a delete racing every kind of write: a turn starting
    (BeginTurn, which also creates records), a lease being taken, an unconditional
    upsert and an append. Each call either wins (and is deleted with the conversation)
    or finds nothing; none fails any other way, and nothing is left behind."""
    start = TurnStart(holder="r", ttl_ms=60_000, new_messages=(NewMessage(MessageRole.USER),))
    refusals: dict[str, int] = {}

    async def attempt(call: Awaitable[object]) -> None:
        try:
            await call
        except (NotFound, LeaseHeld) as exc:  # lost the race: fine
            refusals[type(exc).__name__] = refusals.get(type(exc).__name__, 0) + 1

    for round_no in range(RACE_ROUNDS):
        cid = (await pg_store.create_conversation(user_id=user_id, title="race")).conversation_id
        racers = [
            attempt(pg_store.begin_turn(user_id=user_id, conversation_id=cid, start=start)),
            attempt(
                pg_store.acquire_lease(
                    user_id=user_id,
                    conversation_id=cid,
                    holder="r2",
                    ttl_ms=60_000,
                    max_user_leases=0,
                )
            ),
            attempt(
                pg_store.save_state(
                    user_id=user_id,
                    conversation_id=cid,
                    state_key="agent_state",
                    payload=b"{}",
                    expected_version=None,
                )
            ),
            attempt(
                pg_store.append_message(
                    user_id=user_id, conversation_id=cid, message=NewMessage(MessageRole.USER)
                )
            ),
        ]
        # The delete goes in at a different place each round.
        position = round_no % (len(racers) + 1)
        deleted = asyncio.ensure_future(
            pg_store.delete_conversations(user_id=user_id, conversation_ids=[cid])
        )
        await asyncio.gather(*racers[:position], deleted, *racers[position:])
        assert deleted.result().conversations == 1
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute(
            """SELECT (SELECT count(*) FROM t_conversation WHERE user_id = %(u)s),
                      (SELECT count(*) FROM t_agent_message WHERE user_id = %(u)s),
                      (SELECT count(*) FROM t_agent_state WHERE user_id = %(u)s),
                      (SELECT count(*) FROM t_run_lease WHERE user_id = %(u)s)""",
            {"u": user_id},
        )
        assert await cur.fetchone() == (0, 0, 0, 0)
    assert refusals.get("NotFound", 0) > 0  # the race really happened both ways


async def test_array_parameters_round_trip(pg_store: PostgresStore) -> None:
    """The store's own text[] / bigint[] dumpers quote everything PostgreSQL's array
    syntax treats specially."""
    texts: list[bytes | str | None] = [
        b'[{"text": "say \\"hi\\"\\n"}]',
        "back\\slash, {braces}, commas",
        None,
        "NULL",
        "",
        " spaced ",
        "中文",
    ]
    async with pg_store.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT %s::text[] AS t, %s::bigint[] AS b",
            (TextArray(texts), BigintArray([1, None, 2**62])),
        )
        row = await cur.fetchone()
    assert row is not None
    assert row["t"] == [t.decode() if isinstance(t, bytes) else t for t in texts]
    assert row["b"] == [1, None, 2**62]


@dataclass(frozen=True)
class _OldTurn:
    conversation_id: int
    task_id: int


async def test_migration_6_fences_turns_that_began_before_it(
    postgres: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rolling upgrade: turns begun under migration 5 end under 6. A late save still
    lands when nobody took the lease over, and is fenced when somebody did since."""
    dsn = create_database(postgres, f"fence_{uuid.uuid4().hex[:8]}")
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        monkeypatch.setattr(migrations, "MIGRATIONS", [m for m in MIGRATIONS if m.version < 6])
        await apply_migrations(conn)
        monkeypatch.undo()
    # An old replica begins two turns as migration 5's BeginTurn did: a conversation and
    # its lease row, with no record of the task on the conversation (migration 6 adds it).
    # The rows are written directly: since functions live in files, every migration
    # installs today's text, so migration 5's own function is no longer there to call.
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        old_turns = []
        for _ in range(2):
            cur = await conn.execute(
                "WITH c AS (INSERT INTO t_conversation (user_id, title) VALUES ('u', 't')"
                " RETURNING id)"
                " INSERT INTO t_run_lease (conversation_id, user_id, task_id, holder, expire_time)"
                " SELECT c.id, 'u', agentstate_next_id(), 'old', now() + interval '100 ms'"
                " FROM c RETURNING conversation_id, task_id"
            )
            row = await cur.fetchone()
            assert row is not None
            old_turns.append(_OldTurn(int(row[0]), int(row[1])))
    kept, taken = old_turns
    # The old replica's turns are running (their leases held) when the new schema lands.
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await apply_migrations(conn)
    store = PostgresStore(dsn, max_size=2)
    await store.open()
    try:
        await asyncio.sleep(0.25)  # both leases lapse
        newer = await store.begin_turn(
            user_id="u",
            conversation_id=taken.conversation_id,
            start=TurnStart(holder="new", ttl_ms=60_000),
        )
        await store.save_state(
            user_id="u",
            conversation_id=taken.conversation_id,
            state_key="agent_state",
            payload=b'{"by": "newer"}',
            expected_version=None,
            task_id=newer.lease.task_id,
        )
        with pytest.raises(d.LeaseLost):
            await store.save_state(
                user_id="u",
                conversation_id=taken.conversation_id,
                state_key="agent_state",
                payload=b'{"by": "late"}',
                expected_version=None,
                task_id=taken.task_id,
            )
        saved = await store.save_state(
            user_id="u",
            conversation_id=kept.conversation_id,
            state_key="agent_state",
            payload=b'{"by": "old"}',
            expected_version=None,
            task_id=kept.task_id,
        )
        assert saved.version == 1 and saved.lease_released
    finally:
        await store.close()
