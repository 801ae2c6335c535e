"""The SQL functions live in files (storage/postgres/functions/) and the migration list
installs them by name: the catalog must equal the files, whatever path a database took."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg.rows import tuple_row

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.state_service import domain as d
from agentstate.state_service.storage.postgres import PostgresStore, migrations
from agentstate.state_service.storage.postgres.migrations import (
    MIGRATIONS,
    apply_migrations,
    function_names,
    function_sql,
)
from tests.conftest import create_database

# Everything a migration can change, as text: tables and columns, constraints, indexes,
# functions, triggers, sequences and storage options of the agentstate schema.
SCHEMA_QUERY = """
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
       || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
       || coalesce(' storage ' || a.attstorage::text, '')
       || coalesce(' compression ' || nullif(a.attcompression::text, ''), '')
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p')
UNION ALL
SELECT 'relation ' || c.relname || ' ' || c.relkind::text || ' '
       || coalesce(array_to_string(c.reloptions, ','), '')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
WHERE c.relkind IN ('r', 'p', 'S', 'i', 'v')
UNION ALL
SELECT 'constraint ' || conrelid::regclass::text || ' ' || conname || ' '
       || pg_get_constraintdef(oid)
FROM pg_constraint WHERE connamespace = 'public'::regnamespace
UNION ALL
SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = 'public'
UNION ALL
SELECT 'function ' || pg_get_functiondef(p.oid)
FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(t.oid)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal
ORDER BY 1
"""


async def _schema(dsn: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor(row_factory=tuple_row)
        await cur.execute(SCHEMA_QUERY)
        return [str(row[0]) for row in await cur.fetchall()]


async def _migrate(dsn: str, up_to: int | None = None) -> None:
    listed = MIGRATIONS if up_to is None else [m for m in MIGRATIONS if m.version <= up_to]
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        original = migrations.MIGRATIONS
        migrations.MIGRATIONS = listed
        try:
            await apply_migrations(conn)
        finally:
            migrations.MIGRATIONS = original


@pytest.fixture
async def fresh(postgres: EmbeddedPostgres) -> str:
    dsn = create_database(postgres, f"fresh_{uuid.uuid4().hex[:8]}")
    await _migrate(dsn)
    return dsn


async def test_the_catalog_holds_exactly_the_function_files(fresh: str) -> None:
    async with await psycopg.AsyncConnection.connect(fresh) as conn:
        cur = conn.cursor(row_factory=tuple_row)
        await cur.execute(
            "SELECT proname, count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace"
            " AND proname LIKE 'agentstate%%' GROUP BY proname ORDER BY proname"
        )
        catalog = {str(name): int(n) for name, n in await cur.fetchall()}
        assert sorted(catalog) == function_names()
        assert {name: n for name, n in catalog.items() if n != 1} == {}, "stale overloads"
        # Each file, installed again, changes nothing: the catalog is the files' text.
        for name in function_names():
            await cur.execute(
                "SELECT pg_get_functiondef(oid) FROM pg_proc WHERE proname = %s", (name,)
            )
            before = await cur.fetchall()
            async with conn.transaction(force_rollback=True):
                await conn.execute(function_sql(name).encode())
                await cur.execute(
                    "SELECT pg_get_functiondef(oid) FROM pg_proc WHERE proname = %s", (name,)
                )
                assert await cur.fetchall() == before, name


async def test_every_function_file_is_installed_by_some_migration() -> None:
    listed = {name for migration in MIGRATIONS for name in migration.functions()}
    assert sorted(listed) == function_names()


async def test_a_database_upgraded_from_any_version_equals_a_fresh_one(
    postgres: EmbeddedPostgres, fresh: str
) -> None:
    wanted = await _schema(fresh)
    for migration in MIGRATIONS[:-1]:
        dsn = create_database(postgres, f"from_{migration.version}_{uuid.uuid4().hex[:6]}")
        await _migrate(dsn, up_to=migration.version)
        await _migrate(dsn)
        assert await _schema(dsn) == wanted, f"upgraded from version {migration.version}"


async def test_a_changed_function_file_is_installed_on_the_next_migrate(
    fresh: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An edit of a function's file reaches databases migrated before it, with no new
    migration: the recorded sha-256 no longer matches."""
    name = "agentstate_next_id"
    changed = function_sql(name).replace("$$", "$$ -- edited\n", 1)
    monkeypatch.setattr(
        migrations, "function_sql", lambda n: changed if n == name else function_sql(n)
    )
    await _migrate(fresh)
    async with await psycopg.AsyncConnection.connect(fresh) as conn:
        cur = await conn.execute("SELECT prosrc FROM pg_proc WHERE proname = %s", (name,))
        row = await cur.fetchone()
    assert row is not None and "-- edited" in row[0]


async def test_migration_12_keeps_the_rows_of_the_jsonb_layout(postgres: EmbeddedPostgres) -> None:
    """Rows written in the layout before migration 12 (jsonb payloads) read back as they
    did after it, with no rewrite, and their next write moves them to text without
    losing a value (issue 22: faithful payloads)."""
    dsn = create_database(postgres, f"from_11_{uuid.uuid4().hex[:6]}")
    await _migrate(dsn, up_to=11)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor(row_factory=tuple_row)
        await cur.execute(
            "INSERT INTO t_conversation (user_id, title) VALUES ('u', 't') RETURNING id"
        )
        row = await cur.fetchone()
        assert row is not None
        cid = int(row[0])
        for statement in (
            "UPDATE t_conversation SET item_revision = 2 WHERE id = %(c)s",
            "INSERT INTO t_conversation_item (user_id, conversation_id, seq, item, item_time) "
            'VALUES (\'u\', %(c)s, 1, \'{"role": "user", "n": 1.50}\', now()), '
            "       ('u', %(c)s, 2, '{\"b\": 1, \"a\": [2]}', now())",
            "INSERT INTO t_agent_state (user_id, session_id, state_key, payload, version) "
            "VALUES ('u', %(c)s, 'agent_state', '{\"z\": 1, \"context\": [{\"m\": 1}]}', 3), "
            "       ('u', %(c)s, 'adk.session', '{\"k\": 1.0}', 1)",
            "INSERT INTO t_scoped_state (app_name, user_id, payload, version) "
            "VALUES ('app', '', '{\"x\": 1}', 1)",
            "INSERT INTO t_checkpoint (user_id, conversation_id, namespace, checkpoint_id, "
            "  checkpoint_type, checkpoint, metadata, channel_versions) "
            "VALUES ('u', %(c)s, '', 'c1', 'json', '\\x7b7d', "
            '        \'{"run_id": "r", "step": 1}\', \'{}\')',
        ):
            await conn.execute(statement, {"c": cid})
    store = PostgresStore(dsn, min_size=1, max_size=4)
    await store.open()  # applies migration 12
    try:
        page = await store.list_items(
            user_id="u", conversation_id=cid, last_n=None, min_item_time=None,
            page_size=10, after_seq=None,
        )  # fmt: skip
        assert [i.item_json for i in page.items] == [
            b'{"n": 1.50, "role": "user"}',
            b'{"a": [2], "b": 1}',
        ]
        state = await store.get_state(user_id="u", conversation_id=cid, state_key="agent_state")
        assert (state.payload, state.version) == (b'{"z": 1, "context": [{"m": 1}]}', 3)
        scoped = await store.get_scoped_state(user_id="u", app_name="app")
        assert scoped.app is not None and scoped.app.payload == b'{"x": 1}'
        checkpoint = await store.get_checkpoint(
            user_id="u", conversation_id=cid, namespace="", checkpoint_id="c1"
        )
        assert checkpoint is not None
        assert checkpoint.metadata_json == b'{"step": 1, "run_id": "r"}'
        # The next writes: a delta on the jsonb state, a merge into the jsonb rows, a pop.
        saved = await store.save_state(
            user_id="u", conversation_id=cid, state_key="agent_state", payload=None,
            expected_version=None,
            delta=d.StateDelta(3, messages=(b'{"s": "\\u0000", "f": 1e21}',)),
        )  # fmt: skip
        assert saved.version == 4
        state = await store.get_state(user_id="u", conversation_id=cid, state_key="agent_state")
        assert state.payload == b'{"z": 1, "context": [{"m": 1}, {"s": "\\u0000", "f": 1e21}]}'
        await store.append_event(
            user_id="u", conversation_id=cid,
            event=d.EventAppend(
                item=d.NewItem(b'{"id": "e", "v": -0.0}'), expected_revision=2,
                state_key="adk.session",
                state_delta=d.state_delta(b'{"n": 1e21}', 1 << 20, "state_delta"),
                app_name="app", app_delta=d.state_delta(b'{"y": -0.0}', 1 << 20, "app"),
            ),
        )  # fmt: skip
        state = await store.get_state(user_id="u", conversation_id=cid, state_key="adk.session")
        assert (state.payload, state.version) == (b'{"k": 1.0, "n": 1e21}', 2)
        scoped = await store.get_scoped_state(user_id="u", app_name="app")
        assert scoped.app is not None and scoped.app.payload == b'{"x": 1, "y": -0.0}'
        popped = await store.pop_item(user_id="u", conversation_id=cid, expected_revision=3)
        assert popped.item is not None and popped.item.item_json == b'{"id": "e", "v": -0.0}'
        popped = await store.pop_item(user_id="u", conversation_id=cid, expected_revision=4)
        assert popped.item is not None and popped.item.item_json == b'{"a": [2], "b": 1}'
    finally:
        await store.close()


async def test_migration_15_keeps_the_rows_and_adopts_indexes_built_beforehand(
    postgres: EmbeddedPostgres,
) -> None:
    """Migration 15 (user_id first in every key) on a database with rows: nothing is lost,
    an index built beforehand CONCURRENTLY (docs/scaling.md) becomes the key as it is (no
    rebuild), one a failed concurrent build left invalid is built again, and the upserts
    on the new keys (a lapsed lease taken again, a context rewritten) work after it."""
    dsn = create_database(postgres, f"from_14_{uuid.uuid4().hex[:6]}")
    await _migrate(dsn, up_to=14)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor(row_factory=tuple_row)
        await cur.execute(
            "INSERT INTO t_conversation (user_id, title) VALUES ('u', 'a'), ('u', 'b') RETURNING id"
        )
        cid, other = [int(r[0]) for r in await cur.fetchall()]
        for statement in (
            "INSERT INTO t_agent_message (user_id, conversation_id, role, blocks, status) "
            "VALUES ('u', %(c)s, 'USER', '[]', 'NORMAL'), ('u', %(c)s, 'ASSISTANT', '[]', 'ERROR')",
            "INSERT INTO t_context_compaction (user_id, conversation_id, messages_before, "
            "  messages_after, tokens_before, tokens_after, summary_chars, reason) "
            "VALUES ('u', %(c)s, 10, 2, 1000, 200, 50, 'test')",
            # Lapsed leases (the next take goes through ON CONFLICT on the key).
            "INSERT INTO t_run_lease (conversation_id, user_id, task_id, holder, expire_time) "
            "VALUES (%(c)s, 'u', 1, 'h', now() - interval '1 minute'), "
            "       (%(o)s, 'u', 2, 'h', now() - interval '1 minute')",
            "INSERT INTO t_agent_state (user_id, session_id, state_key, payload, version, "
            "  context_start, context_count, context_bytes, context_head, context_tail) "
            "VALUES ('u', %(c)s, 'agent_state', '{}', 1, 0, 2, 16, '{\"context\": ', '}')",
            "INSERT INTO t_agent_state_message (user_id, session_id, state_key, position, "
            "  message) VALUES ('u', %(c)s, 'agent_state', 0, '{\"m\": 1}'), "
            "  ('u', %(c)s, 'agent_state', 1, '{\"m\": 2}')",
            "INSERT INTO t_scoped_state (app_name, user_id, payload, version) "
            "VALUES ('app', '', '{\"x\": 1}', 1), ('app', 'u', '{\"y\": 2}', 1)",
        ):
            await conn.execute(statement, {"c": cid, "o": other})
        # Built beforehand, online, as docs/scaling.md says; and one left invalid (a
        # unique index on user_id alone fails: two leases of one user).
        await conn.execute(
            "CREATE UNIQUE INDEX CONCURRENTLY t_agent_message_user_key "
            "ON t_agent_message (user_id, conversation_id, id)"
        )
        with pytest.raises(psycopg.errors.UniqueViolation):
            await conn.execute(
                "CREATE UNIQUE INDEX CONCURRENTLY t_run_lease_user_task_key "
                "ON t_run_lease (user_id)"
            )
        await cur.execute(
            "SELECT c.relname, c.oid::bigint, i.indisvalid FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname IN ('t_agent_message_user_key', 't_run_lease_user_task_key') "
            "ORDER BY 1"
        )
        prebuilt = await cur.fetchall()
        assert [(name, valid) for name, _, valid in prebuilt] == [
            ("t_agent_message_user_key", True),
            ("t_run_lease_user_task_key", False),
        ]
        await cur.execute(
            "SELECT (SELECT count(*) FROM t_agent_message), (SELECT count(*) FROM t_run_lease),"
            " (SELECT count(*) FROM t_agent_state_message), (SELECT count(*) FROM t_scoped_state),"
            " (SELECT count(*) FROM t_context_compaction)"
        )
        counts = await cur.fetchone()

    await _migrate(dsn)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor(row_factory=tuple_row)
        await cur.execute(
            "SELECT (SELECT count(*) FROM t_agent_message), (SELECT count(*) FROM t_run_lease),"
            " (SELECT count(*) FROM t_agent_state_message), (SELECT count(*) FROM t_scoped_state),"
            " (SELECT count(*) FROM t_context_compaction)"
        )
        assert await cur.fetchone() == counts
        await cur.execute(
            "SELECT conindid::bigint FROM pg_constraint WHERE conname = 't_agent_message_pkey'"
        )
        assert await cur.fetchone() == (prebuilt[0][1],)  # adopted, not rebuilt
        await cur.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname IN "
            "('t_run_lease_pkey', 't_run_lease_user_id_task_id_key') ORDER BY conname"
        )
        assert [r[0] for r in await cur.fetchall()] == [
            "PRIMARY KEY (user_id, conversation_id)",
            "UNIQUE (user_id, task_id)",
        ]
    fresh = create_database(postgres, f"fresh15_{uuid.uuid4().hex[:6]}")
    await _migrate(fresh)
    assert await _schema(dsn) == await _schema(fresh)

    store = PostgresStore(dsn, min_size=1, max_size=2)
    await store.open()
    try:
        lease = await store.acquire_lease(
            user_id="u", conversation_id=cid, holder="h2", ttl_ms=60_000, max_user_leases=0
        )
        assert lease.lapsed_task_id == 1  # the old row, taken over through the new key
        state = await store.get_state(user_id="u", conversation_id=cid, state_key="agent_state")
        assert state.payload == b'{"context": [{"m": 1}, {"m": 2}]}'
        saved = await store.save_state(
            user_id="u", conversation_id=cid, state_key="agent_state",
            payload=b'{"context": [{"m": 1}, {"m": 3}]}', expected_version=1,
        )  # fmt: skip
        assert saved.version == 2
        state = await store.get_state(user_id="u", conversation_id=cid, state_key="agent_state")
        assert state.payload == b'{"context": [{"m": 1}, {"m": 3}]}'
        conversation = await store.get_conversation(user_id="u", conversation_id=cid)
        assert conversation.status is d.ConversationStatus.RUNNING
        failed = await store.search_conversations(
            where=d.ConversationFilter(
                user_id="u", statuses=frozenset({d.ConversationStatus.FAILED})
            ),
            page_size=10,
            before_id=None,
        )
        assert failed.page.items == []  # its ERROR record is the last, but a turn runs
    finally:
        await store.close()
