"""Ordered, versioned schema migrations.

Append new migrations at the end; never edit an applied one. `apply_migrations`
runs the missing ones in order, each recorded in `agentstate_schema_migrations`,
under a transaction-scoped advisory lock so two replicas starting at once (or a
`migrate` command beside a starting server) apply each migration exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


# Arbitrary constant: the advisory lock that serialises migrators.
MIGRATION_LOCK_ID = 0x6167_7374_6174_6531  # "agstate1"

CREATE_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS agentstate_schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""

MIGRATIONS: list[Migration] = [
    Migration(
        1,
        "ids, conversations, message records, agent state",
        """
-- Time-ordered 64-bit ids like the source's 2104420977583996928: milliseconds
-- since 2010-11-04 in the high bits, a sequence in the low 22 bits. Made by the
-- database so every replica draws from one sequence.
CREATE SEQUENCE agentstate_id_seq;
CREATE FUNCTION agentstate_next_id() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT ((floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1288834974657) << 22)
           | (nextval('agentstate_id_seq') % 4194304)
$$;

CREATE TABLE t_conversation (
    id          bigint PRIMARY KEY DEFAULT agentstate_next_id(),
    user_id     text NOT NULL,
    title       text NOT NULL,
    create_time timestamptz NOT NULL DEFAULT now(),
    update_time timestamptz NOT NULL DEFAULT now(),
    -- Target of the child tables' foreign keys; also serves per-user listing
    -- newest first (ids are time-ordered).
    CONSTRAINT t_conversation_user_id_id_key UNIQUE (user_id, id)
);

CREATE TABLE t_agent_message (
    id              bigint PRIMARY KEY DEFAULT agentstate_next_id(),
    user_id         text NOT NULL,
    conversation_id bigint NOT NULL,
    role            text NOT NULL CHECK (role IN ('USER', 'ASSISTANT')),
    blocks          jsonb NOT NULL CHECK (jsonb_typeof(blocks) = 'array'),
    status          text NOT NULL CHECK (status IN
                        ('NORMAL', 'AWAITING_CONFIRM', 'INTERRUPTED', 'ERROR', 'STREAMING')),
    metadata        jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    create_time     timestamptz NOT NULL DEFAULT now(),
    update_time     timestamptz NOT NULL DEFAULT now(),
    -- No cascade: deletes are explicit, counted and in one transaction; the key
    -- makes a late append to a deleted conversation fail.
    CONSTRAINT t_agent_message_conversation_fkey FOREIGN KEY (user_id, conversation_id)
        REFERENCES t_conversation (user_id, id)
);
-- Per-conversation replay in order.
CREATE INDEX t_agent_message_replay_idx ON t_agent_message (user_id, conversation_id, id);

CREATE TABLE t_agent_state (
    user_id     text NOT NULL,
    session_id  bigint NOT NULL,
    state_key   text NOT NULL,
    payload     jsonb NOT NULL CHECK (jsonb_typeof(payload) = 'object'),
    version     bigint NOT NULL CHECK (version > 0),
    create_time timestamptz NOT NULL DEFAULT now(),
    update_time timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, session_id, state_key),
    CONSTRAINT t_agent_state_conversation_fkey FOREIGN KEY (user_id, session_id)
        REFERENCES t_conversation (user_id, id)
);
""",
    ),
    Migration(
        2,
        "run leases: one turn at a time per conversation",
        """
CREATE TABLE t_run_lease (
    conversation_id bigint PRIMARY KEY,
    user_id         text NOT NULL,
    task_id         bigint NOT NULL UNIQUE,
    holder          text NOT NULL,
    expire_time     timestamptz NOT NULL,
    stop_requested  boolean NOT NULL DEFAULT false,
    create_time     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT t_run_lease_conversation_fkey FOREIGN KEY (user_id, conversation_id)
        REFERENCES t_conversation (user_id, id)
);
-- Counting a user's running turns (the per-user limit).
CREATE INDEX t_run_lease_user_idx ON t_run_lease (user_id, expire_time);
""",
    ),
    Migration(
        3,
        "context compaction audit trail",
        """
CREATE TABLE t_context_compaction (
    id              bigint PRIMARY KEY DEFAULT agentstate_next_id(),
    user_id         text NOT NULL,
    conversation_id bigint NOT NULL,
    messages_before integer NOT NULL,
    messages_after  integer NOT NULL,
    tokens_before   bigint NOT NULL,
    tokens_after    bigint NOT NULL,
    summary_chars   integer NOT NULL,
    reason          text NOT NULL,
    create_time     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT t_context_compaction_conversation_fkey FOREIGN KEY (user_id, conversation_id)
        REFERENCES t_conversation (user_id, id)
);
CREATE INDEX t_context_compaction_conversation_idx
    ON t_context_compaction (user_id, conversation_id, id);
""",
    ),
    Migration(
        4,
        "retention: find inactive conversations",
        """
CREATE INDEX t_conversation_update_time_idx ON t_conversation (update_time);
""",
    ),
]


async def apply_migrations(conn: psycopg.AsyncConnection[object]) -> list[int]:
    """Apply missing migrations in order; return the versions applied now."""
    applied_now: list[int] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_ID,))
        await conn.execute(CREATE_MIGRATIONS_TABLE)
        cur = await conn.execute("SELECT version FROM agentstate_schema_migrations")
        done = {int(row[0]) for row in await cur.fetchall()}  # type: ignore[index]
        for migration in sorted(MIGRATIONS, key=lambda m: m.version):
            if migration.version in done:
                continue
            await conn.execute(migration.sql.encode())
            await conn.execute(
                "INSERT INTO agentstate_schema_migrations (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied_now.append(migration.version)
    return applied_now
