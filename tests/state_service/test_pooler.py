"""Behind PgBouncer in transaction mode (Debian's 1.18: no prepared statements there).

Start-up refuses what the route cannot carry (exit 2, one line naming the variable);
migrations run on the direct URL; readiness follows the pooler; nothing the store does
depends on a server session outliving its transaction. The load with faults at 16
replicas is tests/state_service/test_pooler_load.py.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import grpc
import psycopg

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service.domain import TurnStart
from agentstate.state_service.storage.postgres import PostgresStore, sql
from agentstate.state_service.storage.postgres.migrations import MIGRATION_LOCK_ID, MIGRATIONS
from tests.support.pooler_tools import (
    SERVING,
    health,
    pgbouncer,
    pooled_database,
    pooled_env,
    require_pgbouncer,
)
from tests.support.state_process import StateServices


def run_to_exit(
    services: StateServices, env: dict[str, str], timeout: float = 60
) -> tuple[int, str]:
    service = services.start(env, "serve")
    code = service.wait(timeout)
    return code, service.output


def last_line(output: str) -> str:
    return output.strip().splitlines()[-1]


def one_turn(address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.StateServiceStub(channel)
        begun = stub.BeginTurn(
            pb.BeginTurnRequest(user_id="u", holder="h", ttl_ms=10_000), timeout=10
        )
        ended = stub.EndTurn(
            pb.EndTurnRequest(
                user_id="u",
                conversation_id=begun.conversation.conversation_id,
                task_id=begun.lease.task_id,
                payload=b'{"n": 1}',
                expected_version=0,
            ),
            timeout=10,
        )
        assert ended.version == 1 and ended.lease_released


def test_through_pgbouncer_prepared_statements_must_be_off(
    postgres: EmbeddedPostgres, state_services: StateServices
) -> None:
    direct = pooled_database(postgres, "agentstate_pooler_prepared")
    with pgbouncer(postgres, "agentstate_pooler_prepared", pool_size=3) as bouncer:
        prepared = pooled_env(bouncer, direct, STATE_DB_PREPARED_STATEMENTS="on")
        code, output = run_to_exit(state_services, prepared)
        assert code == 2, output
        line = last_line(output)
        assert line.startswith("agentstate-state: STATE_DB_PREPARED_STATEMENTS: "), line
        assert "prepared statement" in line and "turn them off" in line

        # Off: it serves through the pooler, as the ordinary role the pooler logs in as
        # (which may not create tables): the migrations ran on the direct URL.
        service = state_services.start(pooled_env(bouncer, direct), "serve")
        address = service.wait_ready()
        try:
            one_turn(address)
            # psycopg would prepare a statement on its 5th use: run well past that.
            for _ in range(12):
                one_turn(address)
        finally:
            assert service.terminate() == 0, service.output
        assert "database route: not direct" in service.output

        # Without the migration URL the migrations go through the pooler and are refused
        # (that role may not create anything), which shows the URL above was used.
        env = pooled_env(bouncer, direct)
        del env["STATE_MIGRATION_DATABASE_URL"]
        with psycopg.connect(direct, autocommit=True) as conn:
            conn.execute("DELETE FROM agentstate_schema_migrations WHERE version = 6")
        code, output = run_to_exit(state_services, env)
        assert code != 0 and "permission denied" in output, output


def test_a_pool_larger_than_the_server_allows_is_refused(
    postgres: EmbeddedPostgres, state_services: StateServices
) -> None:
    direct = postgres.dsn  # max_connections 200 (EmbeddedPostgres) - 3 reserved
    code, output = run_to_exit(
        state_services,
        {
            "STATE_STORE": "postgres",
            "DATABASE_URL": direct,
            "STATE_DB_POOL_MAX_SIZE": "500",
            "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
        },
    )
    assert code == 2, output
    line = last_line(output)
    assert line.startswith("agentstate-state: STATE_DB_POOL_MAX_SIZE: a pool of 500"), line
    assert "max_connections 200 - 3 reserved = 197" in line


def test_behind_the_pooler_the_server_limit_does_not_bound_the_pool(
    postgres: EmbeddedPostgres, state_services: StateServices
) -> None:
    direct = pooled_database(postgres, "agentstate_pooler_big")
    with pgbouncer(postgres, "agentstate_pooler_big", pool_size=2) as bouncer:
        service = state_services.start(
            pooled_env(bouncer, direct, STATE_DB_POOL_MAX_SIZE="500"), "serve"
        )
        address = service.wait_ready()
        try:
            one_turn(address)
        finally:
            assert service.terminate() == 0, service.output


def test_a_migration_that_cannot_take_its_lock_stops_start_up(
    postgres: EmbeddedPostgres, state_services: StateServices
) -> None:
    direct = pooled_database(postgres, "agentstate_pooler_lock")
    with psycopg.connect(direct) as holder:  # another migrator, mid-way
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_ID,))
        started = time.monotonic()
        code, output = run_to_exit(
            state_services,
            {
                "STATE_STORE": "postgres",
                "DATABASE_URL": direct,
                "STATE_MIGRATION_LOCK_TIMEOUT_SECONDS": "0.5",
                "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
            },
        )
        assert time.monotonic() - started < 30
        holder.rollback()
    assert code == 2, output
    line = last_line(output)
    assert line.startswith("agentstate-state: STATE_MIGRATION_LOCK_TIMEOUT_SECONDS: "), line
    assert "not free within 0.5s" in line
    with psycopg.connect(direct) as conn:  # nothing was applied
        row = conn.execute("SELECT to_regclass('agentstate_schema_migrations')").fetchone()
        assert row == (None,)


def test_readiness_follows_the_pooler(
    postgres: EmbeddedPostgres, state_services: StateServices
) -> None:
    direct = pooled_database(postgres, "agentstate_pooler_ready")
    with pgbouncer(postgres, "agentstate_pooler_ready", pool_size=2) as bouncer:
        env = pooled_env(
            bouncer,
            direct,
            STATE_DB_CHECK_INTERVAL_SECONDS="0.2",
            STATE_DB_RETRY_INTERVAL_SECONDS="0.2",
            STATE_DB_CHECK_TIMEOUT_SECONDS="1",
        )
        service = state_services.start(env, "serve")
        address = service.wait_ready()
        try:
            assert health(address) == SERVING
            bouncer.stop()
            assert wait_for(lambda: health(address) != SERVING), "still SERVING, pooler down"
            bouncer.start()
            assert wait_for(lambda: health(address) == SERVING), service.output[-2000:]
            one_turn(address)
        finally:
            assert service.terminate() == 0, service.output


def wait_for(condition: object, timeout: float = 15) -> bool:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


# Session state a transaction pooler would leak to other clients or lose between
# statements: advisory locks held past the transaction, LISTEN, temporary tables,
# SQL-level PREPARE, cursors WITH HOLD, DISCARD, set_config(..., false) ...
SESSION_STATE = re.compile(
    r"\bpg_(try_)?advisory_lock(_shared)?\s*\(|\b(UN)?LISTEN\b|"
    r"\bCREATE\s+(GLOBAL\s+|LOCAL\s+)?TEMP(ORARY)?\b|\bPREPARE\s+\w+\s+AS\b|"
    r"\bWITH\s+HOLD\b|\bDISCARD\b|set_config\s*\([^)]*,\s*false\s*\)",
    re.IGNORECASE,
)
# ... and, as a statement of its own, SET / RESET (not SET LOCAL). Inside function
# bodies a line starting with SET is an UPDATE's, so this is for the logged statements.
SESSION_STATEMENT = re.compile(r"\A\s*(SET|RESET)\b(?!\s+LOCAL\b)", re.IGNORECASE)
NAMED_STATEMENT = re.compile(rb"LOG:  execute (?!<unnamed>)[^:]+: ")
_LOGGED = re.compile(rb"LOG:  (?:statement|execute [^:]+): (.*?)(?=\n\S|\Z)", re.DOTALL)


def log_size(path: Path) -> int:
    return path.stat().st_size


def read_from(path: Path, start: int) -> bytes:
    with path.open("rb") as handle:
        handle.seek(start)
        return handle.read()


def test_nothing_depends_on_session_state() -> None:
    """The SQL the store sends and every function the migrations create."""
    texts = {f"migration {m.version}": m.sql for m in MIGRATIONS}
    texts.update({f"sql.{n}": v for n, v in vars(sql).items() if isinstance(v, str)})
    offenders = {
        where: m.group(0) for where, text in texts.items() if (m := SESSION_STATE.search(text))
    }
    assert offenders == {}


async def test_what_the_store_runs_holds_no_session_state(postgres: EmbeddedPostgres) -> None:
    """Every statement PostgreSQL receives from the store, start-up checks, migrations,
    watcher and the RPCs included, as its statement log shows them."""
    require_pgbouncer()
    name = "agentstate_pooler_session"
    direct = pooled_database(postgres, name)
    async with await psycopg.AsyncConnection.connect(postgres.dsn, autocommit=True) as conn:
        await conn.execute(f"ALTER DATABASE {name} SET log_statement = 'all'")
    log = Path(postgres.data_dir / "server.log")
    start = log_size(log)
    with pgbouncer(postgres, name, pool_size=1) as bouncer:
        store = PostgresStore(
            bouncer.url, max_size=3, prepared_statements=False, migration_conninfo=direct
        )
        store.guard.watch_settings = type(store.guard.watch_settings)(interval=0.05)
        await store.open()
        try:
            for _ in range(8):  # past psycopg's prepare threshold
                begun = await store.begin_turn(
                    user_id="u", conversation_id=None, start=TurnStart(holder="h", ttl_ms=5000)
                )
                cid = begun.conversation.conversation_id
                await store.save_state(
                    user_id="u",
                    conversation_id=cid,
                    state_key="agent_state",
                    payload=b"{}",
                    expected_version=0,
                    task_id=begun.lease.task_id,
                )
                await store.delete_conversations(user_id="u", conversation_ids=[cid])
            await asyncio.sleep(0.6)  # watcher probes, more than psycopg's prepare threshold
        finally:
            await store.close()
    statements = [s.decode(errors="replace") for s in _LOGGED.findall(read_from(log, start))]
    assert any("agentstate_begin_turn" in s for s in statements)
    assert any(s.strip() == "SELECT 1" for s in statements)  # the watcher's probe
    offenders = [s for s in statements if SESSION_STATE.search(s) or SESSION_STATEMENT.match(s)]
    assert offenders == []
    # Prepared statements off means off everywhere, the watcher's probe included: every
    # extended-protocol statement is unnamed.
    assert NAMED_STATEMENT.findall(read_from(log, start)) == []
