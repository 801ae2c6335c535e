"""Ordered, versioned schema migrations.

Append new migrations at the end; never edit an applied one. `apply_migrations`
runs the missing ones in order, each recorded in `agentstate_schema_migrations`,
under a transaction-scoped advisory lock so two replicas starting at once (or a
`migrate` command beside a starting server) apply each migration exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg.errors
from psycopg.rows import tuple_row


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
    Migration(
        5,
        "one round trip per call: turn and write functions, open-record index, autovacuum",
        """
-- Every refusal the functions below make is SQLSTATE AS000 with a JSON DETAIL
-- ({"kind": ..., ...}); the store turns it into the domain's error and message.
CREATE FUNCTION agentstate_refuse(p_detail jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'AS000', MESSAGE = p_detail->>'kind', DETAIL = p_detail::text;
END $$;

-- Records that a turn still has open (its STREAMING reply) or that wait for a
-- confirmation: found without scanning a long conversation's records.
CREATE INDEX t_agent_message_open_idx ON t_agent_message (user_id, conversation_id)
    WHERE status IN ('STREAMING', 'AWAITING_CONFIRM');

-- Lock a conversation row for a write and mark the activity. Writes to one
-- conversation queue behind each other; a delete (FOR UPDATE) either commits
-- first, and this finds no row (no resurrection), or waits for this one.
CREATE FUNCTION agentstate_touch_conversation(p_user_id text, p_conversation_id bigint)
RETURNS t_conversation
LANGUAGE plpgsql AS $$
DECLARE
    v_row t_conversation;
BEGIN
    UPDATE t_conversation SET update_time = now()
    WHERE user_id = p_user_id AND id = p_conversation_id
    RETURNING * INTO v_row;
    IF NOT FOUND THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'not_found', 'missing', 'conversation', 'conversation_id', p_conversation_id));
    END IF;
    RETURN v_row;
END $$;

-- Take a conversation's run lease. The caller holds the conversation's row lock.
CREATE FUNCTION agentstate_take_lease(
    p_user_id text, p_conversation_id bigint, p_holder text, p_ttl_ms integer,
    p_max_user_leases integer,
    OUT task_id bigint, OUT expire_time timestamptz, OUT stop_requested boolean,
    OUT lapsed_task_id bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_running integer;
    v_held t_run_lease;
BEGIN
    -- Serialises one user's acquisitions, so the per-user limit holds under races.
    PERFORM pg_advisory_xact_lock(hashtextextended(p_user_id, 7));
    IF p_max_user_leases > 0 THEN
        SELECT count(*) INTO v_running FROM t_run_lease
        WHERE user_id = p_user_id AND expire_time > now() AND conversation_id <> p_conversation_id;
        IF v_running >= p_max_user_leases THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'user_lease_limit', 'running', v_running, 'limit', p_max_user_leases));
        END IF;
    END IF;
    SELECT * INTO v_held FROM t_run_lease WHERE conversation_id = p_conversation_id FOR UPDATE;
    IF FOUND AND v_held.expire_time > now() THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'lease_held', 'conversation_id', p_conversation_id,
            'task_id', v_held.task_id, 'holder', v_held.holder,
            'expire_time', v_held.expire_time));
    END IF;
    -- A row still there lapsed without being released: its turn never finished.
    lapsed_task_id := v_held.task_id;
    INSERT INTO t_run_lease AS l (conversation_id, user_id, task_id, holder, expire_time)
    VALUES (p_conversation_id, p_user_id, agentstate_next_id(), p_holder,
            now() + p_ttl_ms * interval '1 millisecond')
    ON CONFLICT (conversation_id) DO UPDATE
    SET task_id = EXCLUDED.task_id, holder = EXCLUDED.holder,
        expire_time = EXCLUDED.expire_time, stop_requested = false, create_time = now()
    RETURNING l.task_id, l.expire_time, l.stop_requested
    INTO task_id, expire_time, stop_requested;
END $$;

-- AcquireLease: the lease alone, in one statement.
CREATE FUNCTION agentstate_acquire_lease(
    p_user_id text, p_conversation_id bigint, p_holder text, p_ttl_ms integer,
    p_max_user_leases integer,
    OUT task_id bigint, OUT expire_time timestamptz, OUT stop_requested boolean,
    OUT lapsed_task_id bigint)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM t_conversation
    WHERE user_id = p_user_id AND id = p_conversation_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'not_found', 'missing', 'conversation', 'conversation_id', p_conversation_id));
    END IF;
    SELECT * INTO task_id, expire_time, stop_requested, lapsed_task_id
    FROM agentstate_take_lease(p_user_id, p_conversation_id, p_holder, p_ttl_ms,
                               p_max_user_leases);
END $$;

-- Apply message record writes in order; return the rows written, in order.
-- p_kinds[i] is 'insert' (p_roles, p_statuses, p_blocks, p_metadata) or
-- 'update' (p_message_ids, and NULL in p_statuses / p_blocks / p_metadata
-- leaves that column as it is; p_expected_statuses makes it compare-and-set).
-- JSON arrives as text and is parsed here; a bad one fails the statement with
-- PostgreSQL's data error (the store then names the write, off the hot path).
CREATE FUNCTION agentstate_write_messages(
    p_user_id text, p_conversation_id bigint, p_kinds text[], p_message_ids bigint[],
    p_roles text[], p_statuses text[], p_blocks text[], p_metadata text[],
    p_expected_statuses text[])
RETURNS SETOF t_agent_message
LANGUAGE plpgsql AS $$
DECLARE
    v_row t_agent_message;
    v_index integer := 0;
    v_status text;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_kinds, 1), 0) LOOP
        v_index := i - 1;
        IF p_kinds[i] = 'insert' THEN
            INSERT INTO t_agent_message (user_id, conversation_id, role, blocks, status, metadata)
            VALUES (p_user_id, p_conversation_id, p_roles[i], p_blocks[i]::jsonb, p_statuses[i],
                    p_metadata[i]::jsonb)
            RETURNING * INTO v_row;
        ELSE
            UPDATE t_agent_message
            SET status = coalesce(p_statuses[i], status),
                blocks = coalesce(p_blocks[i]::jsonb, blocks),
                metadata = coalesce(p_metadata[i]::jsonb, metadata),
                update_time = now()
            WHERE user_id = p_user_id AND conversation_id = p_conversation_id
              AND id = p_message_ids[i]
              AND (p_expected_statuses[i] IS NULL OR status = p_expected_statuses[i])
            RETURNING * INTO v_row;
            IF NOT FOUND THEN
                SELECT status INTO v_status FROM t_agent_message
                WHERE user_id = p_user_id AND conversation_id = p_conversation_id
                  AND id = p_message_ids[i];
                IF NOT FOUND THEN
                    PERFORM agentstate_refuse(jsonb_build_object(
                        'kind', 'not_found', 'missing', 'message', 'index', v_index,
                        'message_id', p_message_ids[i], 'conversation_id', p_conversation_id));
                END IF;
                PERFORM agentstate_refuse(jsonb_build_object(
                    'kind', 'status_mismatch', 'index', v_index, 'message_id', p_message_ids[i],
                    'status', v_status, 'expected', p_expected_statuses[i]));
            END IF;
        END IF;
        RETURN NEXT v_row;
    END LOOP;
END $$;

-- UpsertState and EndTurn: the whole payload (compare-and-set), the message
-- writes and the compaction records, and for EndTurn (p_task_id set) the
-- lease fence and release. One row per message written, in order (one row of
-- NULL message columns when there are none), each carrying the state's result.
CREATE FUNCTION agentstate_save_state(
    p_user_id text, p_conversation_id bigint, p_state_key text, p_payload jsonb,
    p_expected_version bigint, p_task_id bigint,
    p_kinds text[], p_message_ids bigint[], p_roles text[], p_statuses text[],
    p_blocks text[], p_metadata text[], p_expected_statuses text[],
    p_compactions bigint[], p_compaction_reasons text[], p_max_depth integer)
RETURNS TABLE (version bigint, state_update_time timestamptz, lease_released boolean,
               message t_agent_message)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_version bigint;
    v_update_time timestamptz;
    v_current bigint;
    v_holder bigint;
    v_released boolean := false;
    v_row t_agent_message;
    v_written integer := 0;
BEGIN
    -- Set only for a large payload with many brackets (the store checks small ones):
    -- is any value nested deeper than allowed?
    IF p_max_depth IS NOT NULL
       AND jsonb_path_exists(p_payload, format('strict $.**{%s}', p_max_depth + 1)::jsonpath)
    THEN
        PERFORM agentstate_refuse(jsonb_build_object('kind', 'too_deep', 'limit', p_max_depth));
    END IF;
    PERFORM agentstate_touch_conversation(p_user_id, p_conversation_id);
    IF p_task_id IS NOT NULL THEN
        -- Fencing: a turn whose lapsed lease another turn took over must not write.
        SELECT task_id INTO v_holder FROM t_run_lease
        WHERE conversation_id = p_conversation_id FOR UPDATE;
        IF FOUND AND v_holder <> p_task_id THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'lease_lost', 'task_id', p_task_id, 'holder_task_id', v_holder));
        END IF;
    END IF;
    IF p_expected_version IS NULL THEN
        INSERT INTO t_agent_state AS s (user_id, session_id, state_key, payload, version)
        VALUES (p_user_id, p_conversation_id, p_state_key, p_payload, 1)
        ON CONFLICT (user_id, session_id, state_key)
        DO UPDATE SET payload = EXCLUDED.payload, version = s.version + 1, update_time = now()
        RETURNING s.version, s.update_time INTO v_version, v_update_time;
    ELSIF p_expected_version = 0 THEN
        INSERT INTO t_agent_state AS s (user_id, session_id, state_key, payload, version)
        VALUES (p_user_id, p_conversation_id, p_state_key, p_payload, 1)
        ON CONFLICT (user_id, session_id, state_key) DO NOTHING
        RETURNING s.version, s.update_time INTO v_version, v_update_time;
    ELSE
        UPDATE t_agent_state AS s
        SET payload = p_payload, version = s.version + 1, update_time = now()
        WHERE s.user_id = p_user_id AND s.session_id = p_conversation_id
          AND s.state_key = p_state_key AND s.version = p_expected_version
        RETURNING s.version, s.update_time INTO v_version, v_update_time;
    END IF;
    IF v_version IS NULL THEN
        SELECT s.version INTO v_current FROM t_agent_state AS s
        WHERE s.user_id = p_user_id AND s.session_id = p_conversation_id
          AND s.state_key = p_state_key;
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'version_conflict', 'expected', p_expected_version,
            'current', coalesce(v_current, 0)));
    END IF;
    -- Compactions: five numbers each, flattened (see sql.py), and a reason.
    INSERT INTO t_context_compaction (user_id, conversation_id, messages_before, messages_after,
                                      tokens_before, tokens_after, summary_chars, reason)
    SELECT p_user_id, p_conversation_id, p_compactions[i * 5 + 1], p_compactions[i * 5 + 2],
           p_compactions[i * 5 + 3], p_compactions[i * 5 + 4], p_compactions[i * 5 + 5],
           p_compaction_reasons[i + 1]
    FROM generate_series(0, coalesce(array_length(p_compaction_reasons, 1), 0) - 1) AS i
    ORDER BY i;
    IF p_task_id IS NOT NULL THEN
        DELETE FROM t_run_lease WHERE conversation_id = p_conversation_id AND task_id = p_task_id;
        v_released := FOUND;
    END IF;
    FOR v_row IN
        SELECT * FROM agentstate_write_messages(
            p_user_id, p_conversation_id, p_kinds, p_message_ids, p_roles, p_statuses, p_blocks,
            p_metadata, p_expected_statuses)
    LOOP
        v_written := v_written + 1;
        RETURN QUERY SELECT v_version, v_update_time, v_released, v_row;
    END LOOP;
    IF v_written = 0 THEN
        RETURN QUERY SELECT v_version, v_update_time, v_released, NULL::t_agent_message;
    END IF;
END $$;

-- BeginTurn: create or lock the conversation, take the lease, check the card
-- guard, interrupt what a dead turn left STREAMING, append the turn's records
-- and read the state. One row.
CREATE FUNCTION agentstate_begin_turn(
    p_user_id text, p_conversation_id bigint, p_title text, p_state_key text,
    p_holder text, p_ttl_ms integer, p_max_user_leases integer,
    p_require_none_awaiting boolean, p_require_awaiting_message_id bigint,
    p_roles text[], p_statuses text[], p_blocks text[], p_metadata text[])
RETURNS TABLE (conversation t_conversation, conversation_created boolean,
               task_id bigint, expire_time timestamptz, stop_requested boolean,
               lapsed_task_id bigint, interrupted_records integer,
               payload jsonb, version bigint, state_update_time timestamptz,
               message_ids bigint[], message_time timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_conversation t_conversation;
    v_created boolean := p_conversation_id IS NULL;
    v_lease record;
    v_awaiting bigint;
    v_status text;
    v_interrupted integer;
    v_ids bigint[];
    n integer := coalesce(array_length(p_roles, 1), 0);
BEGIN
    IF v_created THEN
        INSERT INTO t_conversation (user_id, title) VALUES (p_user_id, p_title)
        RETURNING * INTO v_conversation;
    ELSE
        v_conversation := agentstate_touch_conversation(p_user_id, p_conversation_id);
    END IF;
    SELECT * INTO v_lease FROM agentstate_take_lease(
        p_user_id, v_conversation.id, p_holder, p_ttl_ms, p_max_user_leases);
    IF p_require_none_awaiting THEN
        SELECT id INTO v_awaiting FROM t_agent_message
        WHERE user_id = p_user_id AND conversation_id = v_conversation.id
          AND status = 'AWAITING_CONFIRM'
        ORDER BY id LIMIT 1;
        IF FOUND THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'card_pending', 'message_id', v_awaiting));
        END IF;
    ELSIF p_require_awaiting_message_id IS NOT NULL THEN
        SELECT status INTO v_status FROM t_agent_message
        WHERE user_id = p_user_id AND conversation_id = v_conversation.id
          AND id = p_require_awaiting_message_id;
        IF NOT FOUND THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'not_found', 'missing', 'message',
                'message_id', p_require_awaiting_message_id,
                'conversation_id', v_conversation.id));
        ELSIF v_status <> 'AWAITING_CONFIRM' THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'not_awaiting', 'message_id', p_require_awaiting_message_id,
                'status', v_status));
        END IF;
    END IF;
    -- Holding the lease means no turn runs: a record still STREAMING is a dead turn's.
    UPDATE t_agent_message SET status = 'INTERRUPTED', update_time = now()
    WHERE user_id = p_user_id AND conversation_id = v_conversation.id AND status = 'STREAMING';
    GET DIAGNOSTICS v_interrupted = ROW_COUNT;
    SELECT array_agg(m.id ORDER BY m.ordinality) INTO v_ids FROM agentstate_write_messages(
        p_user_id, v_conversation.id, array_fill('insert'::text, ARRAY[n]),
        array_fill(NULL::bigint, ARRAY[n]), p_roles, p_statuses, p_blocks, p_metadata,
        array_fill(NULL::text, ARRAY[n])) WITH ORDINALITY AS m;
    RETURN QUERY
    SELECT v_conversation, v_created, v_lease.task_id, v_lease.expire_time,
           v_lease.stop_requested, v_lease.lapsed_task_id, v_interrupted,
           s.payload, s.version, s.update_time, coalesce(v_ids, '{}'), now()
    FROM (SELECT 1) AS one
    LEFT JOIN t_agent_state AS s
      ON s.user_id = p_user_id AND s.session_id = v_conversation.id
     AND s.state_key = p_state_key;
END $$;

-- DeleteConversation / BatchDeleteConversations: lock every row in id order
-- (concurrent batches cannot deadlock; writers queue behind), all or nothing,
-- children first. Returns the counts.
CREATE FUNCTION agentstate_delete_conversations(p_user_id text, p_ids bigint[],
    OUT conversations bigint, OUT messages bigint, OUT states bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_found bigint[];
    v_missing bigint;
BEGIN
    SELECT coalesce(array_agg(id), '{}') INTO v_found FROM (
        SELECT id FROM t_conversation
        WHERE user_id = p_user_id AND id = ANY(p_ids)
        ORDER BY id FOR UPDATE) AS locked;
    SELECT min(wanted) INTO v_missing FROM unnest(p_ids) AS wanted
    WHERE wanted <> ALL(v_found);
    IF v_missing IS NOT NULL THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'not_found', 'missing', 'conversation', 'conversation_id', v_missing,
            'nothing_deleted', true));
    END IF;
    DELETE FROM t_run_lease WHERE user_id = p_user_id AND conversation_id = ANY(v_found);
    DELETE FROM t_context_compaction WHERE user_id = p_user_id AND conversation_id = ANY(v_found);
    DELETE FROM t_agent_state WHERE user_id = p_user_id AND session_id = ANY(v_found);
    GET DIAGNOSTICS states = ROW_COUNT;
    DELETE FROM t_agent_message WHERE user_id = p_user_id AND conversation_id = ANY(v_found);
    GET DIAGNOSTICS messages = ROW_COUNT;
    DELETE FROM t_conversation WHERE user_id = p_user_id AND id = ANY(v_found);
    GET DIAGNOSTICS conversations = ROW_COUNT;
END $$;

-- Every save replaces the whole payload and leaves a dead copy behind (in the
-- TOAST table once the payload is over ~2 kB compressed). Vacuum this hot,
-- churning table after 1% of its rows (not the default 20%) plus 100 changes,
-- in the main and the TOAST table; leave room on each page for HOT updates
-- (no indexed column changes on a save, so the new row version can stay on
-- the page and the old one is pruned without a vacuum).
ALTER TABLE t_agent_state SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 100,
    autovacuum_analyze_scale_factor = 0.05,
    toast.autovacuum_vacuum_scale_factor = 0.01,
    toast.autovacuum_vacuum_threshold = 100
);
""",
    ),
    Migration(
        6,
        "EndTurn fenced by task: a turn whose lease was taken over never writes again",
        """
-- The fence. Migration 5 refused a late EndTurn only while another task still
-- held the lease row; once that turn had ended (row deleted), the late turn
-- saved over the newer one. So every conversation remembers the task its
-- lease was last granted to, and only that task may end a turn there:
--
--   lease lapsed, no other turn since   -> last_task_id is still the caller's: it saves
--                                          (and releases the row if it is still there)
--   lease taken over by another task    -> last_task_id is the other task's: LEASE_LOST,
--   (running, or finished and released)   nothing changes, whether the lease is free or not
--
-- NULL means no lease was granted since this migration and none was held when
-- it ran: nothing can have taken over, so the caller may save (as before).
ALTER TABLE t_conversation ADD COLUMN last_task_id bigint;
UPDATE t_conversation AS c SET last_task_id = l.task_id
FROM t_run_lease AS l WHERE l.user_id = c.user_id AND l.conversation_id = c.id;

-- Recorded by a trigger, so every way of granting a lease (BeginTurn,
-- AcquireLease, whatever replaces them) keeps the fence current. The granting
-- statement already holds the conversation's row lock.
CREATE FUNCTION agentstate_record_lease_task() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE t_conversation SET last_task_id = NEW.task_id
    WHERE user_id = NEW.user_id AND id = NEW.conversation_id;
    RETURN NULL;
END $$;
CREATE TRIGGER t_run_lease_record_task AFTER INSERT OR UPDATE OF task_id ON t_run_lease
FOR EACH ROW EXECUTE FUNCTION agentstate_record_lease_task();

-- EndTurn's fence, on its own so a rewrite of the save carries it as one call.
-- The caller has locked the conversation row (agentstate_touch_conversation),
-- so no lease can be granted between this check and the save.
CREATE FUNCTION agentstate_fence_turn(p_user_id text, p_conversation_id bigint,
                                      p_task_id bigint)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_last bigint;
BEGIN
    SELECT last_task_id INTO v_last FROM t_conversation
    WHERE user_id = p_user_id AND id = p_conversation_id;
    IF v_last IS NOT NULL AND v_last <> p_task_id THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'lease_lost', 'task_id', p_task_id, 'holder_task_id', v_last));
    END IF;
END $$;

-- UpsertState and EndTurn as in migration 5, with agentstate_fence_turn in
-- place of the check on the lease row.
CREATE OR REPLACE FUNCTION agentstate_save_state(
    p_user_id text, p_conversation_id bigint, p_state_key text, p_payload jsonb,
    p_expected_version bigint, p_task_id bigint,
    p_kinds text[], p_message_ids bigint[], p_roles text[], p_statuses text[],
    p_blocks text[], p_metadata text[], p_expected_statuses text[],
    p_compactions bigint[], p_compaction_reasons text[], p_max_depth integer)
RETURNS TABLE (version bigint, state_update_time timestamptz, lease_released boolean,
               message t_agent_message)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_version bigint;
    v_update_time timestamptz;
    v_current bigint;
    v_released boolean := false;
    v_row t_agent_message;
    v_written integer := 0;
BEGIN
    -- Set only for a large payload with many brackets (the store checks small ones):
    -- is any value nested deeper than allowed?
    IF p_max_depth IS NOT NULL
       AND jsonb_path_exists(p_payload, format('strict $.**{%s}', p_max_depth + 1)::jsonpath)
    THEN
        PERFORM agentstate_refuse(jsonb_build_object('kind', 'too_deep', 'limit', p_max_depth));
    END IF;
    PERFORM agentstate_touch_conversation(p_user_id, p_conversation_id);
    IF p_task_id IS NOT NULL THEN
        PERFORM agentstate_fence_turn(p_user_id, p_conversation_id, p_task_id);
    END IF;
    IF p_expected_version IS NULL THEN
        INSERT INTO t_agent_state AS s (user_id, session_id, state_key, payload, version)
        VALUES (p_user_id, p_conversation_id, p_state_key, p_payload, 1)
        ON CONFLICT (user_id, session_id, state_key)
        DO UPDATE SET payload = EXCLUDED.payload, version = s.version + 1, update_time = now()
        RETURNING s.version, s.update_time INTO v_version, v_update_time;
    ELSIF p_expected_version = 0 THEN
        INSERT INTO t_agent_state AS s (user_id, session_id, state_key, payload, version)
        VALUES (p_user_id, p_conversation_id, p_state_key, p_payload, 1)
        ON CONFLICT (user_id, session_id, state_key) DO NOTHING
        RETURNING s.version, s.update_time INTO v_version, v_update_time;
    ELSE
        UPDATE t_agent_state AS s
        SET payload = p_payload, version = s.version + 1, update_time = now()
        WHERE s.user_id = p_user_id AND s.session_id = p_conversation_id
          AND s.state_key = p_state_key AND s.version = p_expected_version
        RETURNING s.version, s.update_time INTO v_version, v_update_time;
    END IF;
    IF v_version IS NULL THEN
        SELECT s.version INTO v_current FROM t_agent_state AS s
        WHERE s.user_id = p_user_id AND s.session_id = p_conversation_id
          AND s.state_key = p_state_key;
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'version_conflict', 'expected', p_expected_version,
            'current', coalesce(v_current, 0)));
    END IF;
    -- Compactions: five numbers each, flattened (see sql.py), and a reason.
    INSERT INTO t_context_compaction (user_id, conversation_id, messages_before, messages_after,
                                      tokens_before, tokens_after, summary_chars, reason)
    SELECT p_user_id, p_conversation_id, p_compactions[i * 5 + 1], p_compactions[i * 5 + 2],
           p_compactions[i * 5 + 3], p_compactions[i * 5 + 4], p_compactions[i * 5 + 5],
           p_compaction_reasons[i + 1]
    FROM generate_series(0, coalesce(array_length(p_compaction_reasons, 1), 0) - 1) AS i
    ORDER BY i;
    IF p_task_id IS NOT NULL THEN
        DELETE FROM t_run_lease WHERE conversation_id = p_conversation_id AND task_id = p_task_id;
        v_released := FOUND;
    END IF;
    FOR v_row IN
        SELECT * FROM agentstate_write_messages(
            p_user_id, p_conversation_id, p_kinds, p_message_ids, p_roles, p_statuses, p_blocks,
            p_metadata, p_expected_statuses)
    LOOP
        v_written := v_written + 1;
        RETURN QUERY SELECT v_version, v_update_time, v_released, v_row;
    END LOOP;
    IF v_written = 0 THEN
        RETURN QUERY SELECT v_version, v_update_time, v_released, NULL::t_agent_message;
    END IF;
END $$;
""",
    ),
    Migration(
        7,
        "conversation keys chosen by callers (ResolveConversation)",
        """
-- NULL: no key. Unique per user; NULLs never conflict, so keyless conversations
-- are unaffected. The key goes with the row on delete: resolving it afterwards
-- creates a new conversation with a new id.
ALTER TABLE t_conversation ADD COLUMN external_key text;
ALTER TABLE t_conversation ADD CONSTRAINT t_conversation_external_key_key
    UNIQUE (user_id, external_key);
""",
    ),
    # Issue 15 (h15-langgraph): a graph runtime's checkpoints as part of a
    # conversation's agent state. Children of t_conversation with ON DELETE
    # CASCADE, so DeleteConversation, batch delete and retention remove them in
    # their one transaction without knowing these tables.
    Migration(
        8,
        "checkpoints",
        """
CREATE TABLE t_checkpoint (
    user_id              text NOT NULL,
    conversation_id      bigint NOT NULL,
    namespace            text NOT NULL,
    checkpoint_id        text NOT NULL,
    parent_checkpoint_id text,
    checkpoint_type      text NOT NULL,
    checkpoint           bytea NOT NULL,
    metadata             jsonb NOT NULL CHECK (jsonb_typeof(metadata) = 'object'),
    -- channel -> version: which rows of t_checkpoint_blob make up this checkpoint
    channel_versions     jsonb NOT NULL,
    run_id               text GENERATED ALWAYS AS (metadata ->> 'run_id') STORED,
    create_time          timestamptz NOT NULL DEFAULT now(),
    -- Also serves "newest of a namespace" (a backward scan) and history listing.
    PRIMARY KEY (user_id, conversation_id, namespace, checkpoint_id),
    CONSTRAINT t_checkpoint_conversation_fkey FOREIGN KEY (user_id, conversation_id)
        REFERENCES t_conversation (user_id, id) ON DELETE CASCADE
);
CREATE INDEX t_checkpoint_run_idx ON t_checkpoint (user_id, run_id) WHERE run_id IS NOT NULL;

-- A channel's value at a version, shared by the checkpoints whose
-- channel_versions name it (a step stores only the channels it changed).
CREATE TABLE t_checkpoint_blob (
    user_id         text NOT NULL,
    conversation_id bigint NOT NULL,
    namespace       text NOT NULL,
    channel         text NOT NULL,
    version         text NOT NULL,
    value_type      text NOT NULL,
    value           bytea NOT NULL,
    PRIMARY KEY (user_id, conversation_id, namespace, channel, version),
    CONSTRAINT t_checkpoint_blob_conversation_fkey FOREIGN KEY (user_id, conversation_id)
        REFERENCES t_conversation (user_id, id) ON DELETE CASCADE
);

-- Pending writes of a checkpoint's tasks. No foreign key to t_checkpoint: a
-- runtime may store a step's writes while that checkpoint's put is in flight.
CREATE TABLE t_checkpoint_write (
    user_id         text NOT NULL,
    conversation_id bigint NOT NULL,
    namespace       text NOT NULL,
    checkpoint_id   text NOT NULL,
    task_id         text NOT NULL,
    idx             integer NOT NULL,
    channel         text NOT NULL,
    value_type      text NOT NULL,
    value           bytea NOT NULL,
    task_path       text NOT NULL DEFAULT '',
    PRIMARY KEY (user_id, conversation_id, namespace, checkpoint_id, task_id, idx),
    CONSTRAINT t_checkpoint_write_conversation_fkey FOREIGN KEY (user_id, conversation_id)
        REFERENCES t_conversation (user_id, id) ON DELETE CASCADE
);

-- PutCheckpoint: lock the conversation row (NOT_FOUND when absent: no
-- resurrection), compare-and-set the namespace's head, store the new channel
-- values (a stored one is kept) and the checkpoint (a stored id is replaced).
CREATE FUNCTION agentstate_put_checkpoint(
    p_user_id text, p_conversation_id bigint, p_namespace text, p_checkpoint_id text,
    p_parent_id text, p_type text, p_checkpoint bytea, p_metadata jsonb,
    p_channel_versions jsonb, p_check_head boolean, p_expected_head text,
    p_channels text[], p_versions text[], p_value_types text[], p_values bytea[])
RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    v_head text;
    v_time timestamptz;
BEGIN
    PERFORM agentstate_touch_conversation(p_user_id, p_conversation_id);
    IF p_check_head AND NOT EXISTS (
        SELECT 1 FROM t_checkpoint
        WHERE user_id = p_user_id AND conversation_id = p_conversation_id
          AND namespace = p_namespace AND checkpoint_id = p_checkpoint_id) THEN
        SELECT checkpoint_id INTO v_head FROM t_checkpoint
        WHERE user_id = p_user_id AND conversation_id = p_conversation_id
          AND namespace = p_namespace
        ORDER BY checkpoint_id DESC LIMIT 1;
        IF coalesce(v_head, '') <> p_expected_head THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'checkpoint_conflict', 'namespace', p_namespace,
                'expected', p_expected_head, 'current', coalesce(v_head, '')));
        END IF;
    END IF;
    INSERT INTO t_checkpoint_blob
        (user_id, conversation_id, namespace, channel, version, value_type, value)
    SELECT p_user_id, p_conversation_id, p_namespace, b.channel, b.version, b.value_type, b.value
    FROM unnest(p_channels, p_versions, p_value_types, p_values)
        AS b(channel, version, value_type, value)
    ON CONFLICT DO NOTHING;
    INSERT INTO t_checkpoint AS c
        (user_id, conversation_id, namespace, checkpoint_id, parent_checkpoint_id,
         checkpoint_type, checkpoint, metadata, channel_versions)
    VALUES (p_user_id, p_conversation_id, p_namespace, p_checkpoint_id, p_parent_id,
            p_type, p_checkpoint, p_metadata, p_channel_versions)
    ON CONFLICT (user_id, conversation_id, namespace, checkpoint_id) DO UPDATE
    SET checkpoint_type = EXCLUDED.checkpoint_type, checkpoint = EXCLUDED.checkpoint,
        metadata = EXCLUDED.metadata, channel_versions = EXCLUDED.channel_versions
    RETURNING c.create_time INTO v_time;
    RETURN v_time;
END $$;

-- PutCheckpointWrites: a key-share lock on the conversation row (writes of
-- several tasks do not queue behind each other; a delete does wait, and a
-- write after it is NOT_FOUND), then insert; idx < 0 replaces.
CREATE FUNCTION agentstate_put_checkpoint_writes(
    p_user_id text, p_conversation_id bigint, p_namespace text, p_checkpoint_id text,
    p_task_ids text[], p_idxs integer[], p_channels text[], p_value_types text[],
    p_values bytea[], p_task_paths text[])
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
BEGIN
    PERFORM 1 FROM t_conversation
    WHERE user_id = p_user_id AND id = p_conversation_id FOR KEY SHARE;
    IF NOT FOUND THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'not_found', 'missing', 'conversation', 'conversation_id', p_conversation_id));
    END IF;
    INSERT INTO t_checkpoint_write AS w
        (user_id, conversation_id, namespace, checkpoint_id, task_id, idx, channel,
         value_type, value, task_path)
    SELECT p_user_id, p_conversation_id, p_namespace, p_checkpoint_id, x.task_id, x.idx,
           x.channel, x.value_type, x.value, x.task_path
    FROM unnest(p_task_ids, p_idxs, p_channels, p_value_types, p_values, p_task_paths)
        AS x(task_id, idx, channel, value_type, value, task_path)
    ON CONFLICT (user_id, conversation_id, namespace, checkpoint_id, task_id, idx) DO UPDATE
    SET channel = EXCLUDED.channel, value_type = EXCLUDED.value_type,
        value = EXCLUDED.value, task_path = EXCLUDED.task_path
    WHERE EXCLUDED.idx < 0;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END $$;

-- After checkpoints of these conversations were deleted: drop the writes and
-- channel values no remaining checkpoint has. The caller holds the row locks.
CREATE FUNCTION agentstate_checkpoint_gc(p_user_id text, p_ids bigint[])
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM t_checkpoint_write AS w
    WHERE w.user_id = p_user_id AND w.conversation_id = ANY(p_ids)
      AND NOT EXISTS (
        SELECT 1 FROM t_checkpoint AS c
        WHERE c.user_id = w.user_id AND c.conversation_id = w.conversation_id
          AND c.namespace = w.namespace AND c.checkpoint_id = w.checkpoint_id);
    DELETE FROM t_checkpoint_blob AS b
    WHERE b.user_id = p_user_id AND b.conversation_id = ANY(p_ids)
      AND NOT EXISTS (
        SELECT 1 FROM t_checkpoint AS c
        WHERE c.user_id = b.user_id AND c.conversation_id = b.conversation_id
          AND c.namespace = b.namespace AND c.channel_versions ->> b.channel = b.version);
END $$;

CREATE FUNCTION agentstate_delete_checkpoints_for_runs(p_user_id text, p_run_ids text[])
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[];
    v_count bigint;
BEGIN
    -- Lock the conversations concerned in id order (puts queue behind; no deadlock).
    SELECT coalesce(array_agg(id), '{}') INTO v_ids FROM (
        SELECT id FROM t_conversation
        WHERE user_id = p_user_id AND id IN (
            SELECT conversation_id FROM t_checkpoint
            WHERE user_id = p_user_id AND run_id = ANY(p_run_ids))
        ORDER BY id FOR NO KEY UPDATE) AS locked;
    DELETE FROM t_checkpoint
    WHERE user_id = p_user_id AND conversation_id = ANY(v_ids) AND run_id = ANY(p_run_ids);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    PERFORM agentstate_checkpoint_gc(p_user_id, v_ids);
    RETURN v_count;
END $$;

CREATE FUNCTION agentstate_copy_checkpoints(p_user_id text, p_source bigint, p_target bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_found bigint[];
    v_count bigint;
BEGIN
    SELECT coalesce(array_agg(id), '{}') INTO v_found FROM (
        SELECT id FROM t_conversation
        WHERE user_id = p_user_id AND id IN (p_source, p_target)
        ORDER BY id FOR NO KEY UPDATE) AS locked;
    IF NOT p_source = ANY(v_found) OR NOT p_target = ANY(v_found) THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'not_found', 'missing', 'conversation', 'conversation_id',
            CASE WHEN p_source = ANY(v_found) THEN p_target ELSE p_source END));
    END IF;
    IF EXISTS (SELECT 1 FROM t_checkpoint
               WHERE user_id = p_user_id AND conversation_id = p_target) THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'target_has_checkpoints', 'conversation_id', p_target));
    END IF;
    UPDATE t_conversation SET update_time = now() WHERE user_id = p_user_id AND id = p_target;
    INSERT INTO t_checkpoint_blob
        (user_id, conversation_id, namespace, channel, version, value_type, value)
    SELECT user_id, p_target, namespace, channel, version, value_type, value
    FROM t_checkpoint_blob WHERE user_id = p_user_id AND conversation_id = p_source;
    INSERT INTO t_checkpoint_write
        (user_id, conversation_id, namespace, checkpoint_id, task_id, idx, channel,
         value_type, value, task_path)
    SELECT user_id, p_target, namespace, checkpoint_id, task_id, idx, channel,
           value_type, value, task_path
    FROM t_checkpoint_write WHERE user_id = p_user_id AND conversation_id = p_source;
    INSERT INTO t_checkpoint
        (user_id, conversation_id, namespace, checkpoint_id, parent_checkpoint_id,
         checkpoint_type, checkpoint, metadata, channel_versions, create_time)
    SELECT user_id, p_target, namespace, checkpoint_id, parent_checkpoint_id,
           checkpoint_type, checkpoint, metadata, channel_versions, create_time
    FROM t_checkpoint WHERE user_id = p_user_id AND conversation_id = p_source;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END $$;

CREATE FUNCTION agentstate_prune_checkpoints(p_user_id text, p_ids bigint[], p_keep_latest boolean)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_found bigint[];
    v_missing bigint;
    v_count bigint;
BEGIN
    SELECT coalesce(array_agg(id), '{}') INTO v_found FROM (
        SELECT id FROM t_conversation
        WHERE user_id = p_user_id AND id = ANY(p_ids)
        ORDER BY id FOR NO KEY UPDATE) AS locked;
    SELECT min(wanted) INTO v_missing FROM unnest(p_ids) AS wanted
    WHERE wanted <> ALL(v_found);
    IF v_missing IS NOT NULL THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'not_found', 'missing', 'conversation', 'conversation_id', v_missing,
            'nothing_pruned', true));
    END IF;
    DELETE FROM t_checkpoint AS c
    WHERE c.user_id = p_user_id AND c.conversation_id = ANY(v_found)
      AND (NOT p_keep_latest OR c.checkpoint_id < (
        SELECT max(h.checkpoint_id) FROM t_checkpoint AS h
        WHERE h.user_id = c.user_id AND h.conversation_id = c.conversation_id
          AND h.namespace = c.namespace));
    GET DIAGNOSTICS v_count = ROW_COUNT;
    PERFORM agentstate_checkpoint_gc(p_user_id, v_found);
    RETURN v_count;
END $$;
""",
    ),
    Migration(
        9,
        "conversation items and app-/user-scoped state (agent framework sessions)",
        """
-- An ordered item list per conversation (OpenAI Agents session items, ADK
-- events). `item_revision` counts changes to it and draws the items' seqs, so a
-- seq is never reused and a compare-and-set on the revision sees every change.
ALTER TABLE t_conversation ADD COLUMN item_revision bigint NOT NULL DEFAULT 0;

CREATE TABLE t_conversation_item (
    user_id         text NOT NULL,
    conversation_id bigint NOT NULL,
    seq             bigint NOT NULL,
    item            jsonb NOT NULL CHECK (jsonb_typeof(item) = 'object'),
    item_time       timestamptz NOT NULL,
    create_time     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, conversation_id, seq),
    -- Gone in the same transaction as the conversation; a late append finds no
    -- conversation row to lock (NOT_FOUND), so nothing comes back.
    CONSTRAINT t_conversation_item_conversation_fkey FOREIGN KEY (user_id, conversation_id)
        REFERENCES t_conversation (user_id, id) ON DELETE CASCADE
);

-- App-scoped (user_id '') and user-scoped state of an application. Not a child of
-- a conversation: it outlives every session of the app or the user.
CREATE TABLE t_scoped_state (
    app_name    text NOT NULL,
    user_id     text NOT NULL,
    payload     jsonb NOT NULL CHECK (jsonb_typeof(payload) = 'object'),
    version     bigint NOT NULL CHECK (version > 0),
    update_time timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (app_name, user_id)
);

-- Lock the conversation (as every write does) and check the caller's revision.
-- Returns the current revision.
CREATE FUNCTION agentstate_lock_items(p_user_id text, p_conversation_id bigint,
                                      p_expected_revision bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_revision bigint;
BEGIN
    PERFORM agentstate_touch_conversation(p_user_id, p_conversation_id);
    SELECT item_revision INTO v_revision FROM t_conversation
    WHERE user_id = p_user_id AND id = p_conversation_id;
    IF p_expected_revision IS NOT NULL AND p_expected_revision <> v_revision THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'revision_conflict', 'expected', p_expected_revision,
            'current', v_revision));
    END IF;
    RETURN v_revision;
END $$;

-- AppendItems: one row per item appended, in order.
CREATE FUNCTION agentstate_append_items(p_user_id text, p_conversation_id bigint,
    p_items text[], p_item_times timestamptz[], p_expected_revision bigint)
RETURNS TABLE (seq bigint, item jsonb, item_time timestamptz, create_time timestamptz,
               revision bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_revision bigint;
    n integer := coalesce(array_length(p_items, 1), 0);
BEGIN
    v_revision := agentstate_lock_items(p_user_id, p_conversation_id, p_expected_revision);
    UPDATE t_conversation SET item_revision = item_revision + n
    WHERE user_id = p_user_id AND id = p_conversation_id;
    RETURN QUERY
    INSERT INTO t_conversation_item AS t (user_id, conversation_id, seq, item, item_time)
    SELECT p_user_id, p_conversation_id, v_revision + i, p_items[i]::jsonb,
           coalesce(p_item_times[i], now())
    FROM generate_series(1, n) AS i
    ORDER BY i
    RETURNING t.seq, t.item, t.item_time, t.create_time, v_revision + n;
END $$;

-- PopItem: one row; NULL item columns when the list was empty.
CREATE FUNCTION agentstate_pop_item(p_user_id text, p_conversation_id bigint,
                                    p_expected_revision bigint)
RETURNS TABLE (seq bigint, item jsonb, item_time timestamptz, create_time timestamptz,
               revision bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_revision bigint;
    v_item t_conversation_item;
BEGIN
    v_revision := agentstate_lock_items(p_user_id, p_conversation_id, p_expected_revision);
    DELETE FROM t_conversation_item AS t
    WHERE t.user_id = p_user_id AND t.conversation_id = p_conversation_id
      AND t.seq = (SELECT max(m.seq) FROM t_conversation_item AS m
                   WHERE m.user_id = p_user_id AND m.conversation_id = p_conversation_id)
    RETURNING t.* INTO v_item;
    IF v_item.seq IS NOT NULL THEN
        UPDATE t_conversation SET item_revision = item_revision + 1
        WHERE user_id = p_user_id AND id = p_conversation_id
        RETURNING item_revision INTO v_revision;
    END IF;
    RETURN QUERY SELECT v_item.seq, v_item.item, v_item.item_time, v_item.create_time,
                        v_revision;
END $$;

-- ClearItems.
CREATE FUNCTION agentstate_clear_items(p_user_id text, p_conversation_id bigint,
                                       OUT deleted bigint, OUT revision bigint)
LANGUAGE plpgsql AS $$
BEGIN
    revision := agentstate_lock_items(p_user_id, p_conversation_id, NULL);
    DELETE FROM t_conversation_item
    WHERE user_id = p_user_id AND conversation_id = p_conversation_id;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    IF deleted > 0 THEN
        UPDATE t_conversation SET item_revision = item_revision + 1
        WHERE user_id = p_user_id AND id = p_conversation_id
        RETURNING item_revision INTO revision;
    END IF;
END $$;

-- Merge a delta into one scoped state (top level: the delta's keys win).
CREATE FUNCTION agentstate_merge_scoped_state(p_app_name text, p_user_id text, p_delta jsonb)
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO t_scoped_state AS s (app_name, user_id, payload, version)
    VALUES (p_app_name, p_user_id, p_delta, 1)
    ON CONFLICT (app_name, user_id) DO UPDATE
    SET payload = s.payload || EXCLUDED.payload, version = s.version + 1, update_time = now()
$$;

-- AppendEvent: the revision check, the item, the three deltas; one row.
CREATE FUNCTION agentstate_append_event(p_user_id text, p_conversation_id bigint,
    p_item text, p_item_time timestamptz, p_expected_revision bigint, p_state_key text,
    p_state_delta jsonb, p_app_name text, p_app_delta jsonb, p_user_delta jsonb)
RETURNS TABLE (seq bigint, item jsonb, item_time timestamptz, create_time timestamptz,
               revision bigint, state_version bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_revision bigint;
    v_item t_conversation_item;
    v_state_version bigint;
BEGIN
    v_revision := agentstate_lock_items(p_user_id, p_conversation_id, p_expected_revision)
                  + 1;
    UPDATE t_conversation SET item_revision = v_revision
    WHERE user_id = p_user_id AND id = p_conversation_id;
    IF p_item IS NOT NULL THEN
        INSERT INTO t_conversation_item AS t (user_id, conversation_id, seq, item, item_time)
        VALUES (p_user_id, p_conversation_id, v_revision, p_item::jsonb,
                coalesce(p_item_time, now()))
        RETURNING t.* INTO v_item;
    END IF;
    IF p_state_delta IS NOT NULL THEN
        INSERT INTO t_agent_state AS s (user_id, session_id, state_key, payload, version)
        VALUES (p_user_id, p_conversation_id, p_state_key, p_state_delta, 1)
        ON CONFLICT (user_id, session_id, state_key) DO UPDATE
        SET payload = s.payload || EXCLUDED.payload, version = s.version + 1,
            update_time = now()
        RETURNING s.version INTO v_state_version;
    ELSE
        SELECT s.version INTO v_state_version FROM t_agent_state AS s
        WHERE s.user_id = p_user_id AND s.session_id = p_conversation_id
          AND s.state_key = p_state_key;
    END IF;
    IF p_app_delta IS NOT NULL THEN
        PERFORM agentstate_merge_scoped_state(p_app_name, '', p_app_delta);
    END IF;
    IF p_user_delta IS NOT NULL THEN
        PERFORM agentstate_merge_scoped_state(p_app_name, p_user_id, p_user_delta);
    END IF;
    RETURN QUERY SELECT v_item.seq, v_item.item, v_item.item_time, v_item.create_time,
                        v_revision, coalesce(v_state_version, 0);
END $$;
""",
    ),
    Migration(
        10,
        "delta saves: context messages as rows, the rest of the state as one row",
        """
-- A state whose "context" is an array is stored split: each message of the
-- context is a row here (its text as PostgreSQL's JSONB prints it), the rest
-- of the state stays in t_agent_state.payload (without "context"). Positions
-- are absolute: the context is [context_start, context_start + context_count),
-- so dropping messages from the front (compaction) renumbers nothing.
CREATE TABLE t_agent_state_message (
    user_id    text NOT NULL,
    session_id bigint NOT NULL,
    state_key  text NOT NULL,
    position   bigint NOT NULL,
    message    text NOT NULL,
    -- session_id first: the key stays small (no user_id in every entry) and serves
    -- the cascade from t_conversation as well as reading a context in order.
    PRIMARY KEY (session_id, state_key, position),
    CONSTRAINT t_agent_state_message_conversation_fkey FOREIGN KEY (user_id, session_id)
        REFERENCES t_conversation (user_id, id) ON DELETE CASCADE
);
-- Rows are appended and, on a compaction or a replaced tail, deleted: vacuum
-- early, as for t_agent_state.
ALTER TABLE t_agent_state_message SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 200,
    autovacuum_vacuum_insert_scale_factor = 0.05
);

-- NULL context columns: payload holds the whole state (written before this
-- migration and not split yet, or a state without a "context" array).
-- context_bytes: the sum of the rows' octet lengths, so the size of the whole
-- state is known without reading the rows. context_head / context_tail: the
-- state's text before and after the context array (the rest's members in
-- jsonb's order, "context" where that order puts it), made when the rest
-- changes, so reading a state is one concatenation. NOT VALID: existing rows
-- (all NULL) satisfy it; no scan under an exclusive lock.
ALTER TABLE t_agent_state
    ADD COLUMN context_start bigint,
    ADD COLUMN context_count integer,
    ADD COLUMN context_bytes bigint,
    ADD COLUMN context_head text,
    ADD COLUMN context_tail text,
    ADD CONSTRAINT t_agent_state_context_check CHECK (
        (context_start IS NULL AND context_count IS NULL AND context_bytes IS NULL
         AND context_head IS NULL AND context_tail IS NULL)
        OR (context_start >= 0 AND context_count >= 0 AND context_bytes >= 0
            AND context_head IS NOT NULL AND context_tail IS NOT NULL
            AND NOT payload ? 'context')) NOT VALID;

-- The text around a state's context array, byte for byte what jsonb prints for
-- the unsplit state: the rest's members in jsonb's key order (shorter keys
-- first, then bytewise) with "context" where that order puts it.
CREATE FUNCTION agentstate_state_frame(p_rest jsonb, OUT head text, OUT tail text)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT '{' || coalesce(string_agg(part, ', ' ORDER BY n) FILTER (WHERE before), '')
               || CASE WHEN bool_or(before) THEN ', ' ELSE '' END || '"context": ',
           coalesce(', ' || string_agg(part, ', ' ORDER BY n) FILTER (WHERE NOT before), '')
               || '}'
    FROM (
        SELECT e.n, to_jsonb(e.key)::text || ': ' || e.value::text AS part,
               octet_length(e.key) < 7
               OR (octet_length(e.key) = 7
                   AND convert_to(e.key, 'UTF8') < convert_to('context', 'UTF8')) AS before
        FROM jsonb_each(p_rest) WITH ORDINALITY AS e(key, value, n)
    ) AS parts
$$;

-- The whole state's text from its rest and its context array's text.
CREATE FUNCTION agentstate_state_text(p_rest jsonb, p_context text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT f.head || p_context || f.tail FROM agentstate_state_frame(p_rest) AS f
$$;

-- Write a context's messages from index p_from on (positions p_start + p_from
-- ...) and remove every row after them. Rows whose text is unchanged are left
-- alone, so a whole-state save writes only the messages that changed. The
-- caller holds the conversation's row lock. Returns the octet length of the
-- rows it removed or replaced (what the tail weighed before).
CREATE FUNCTION agentstate_write_context(
    p_user_id text, p_session_id bigint, p_state_key text, p_start bigint, p_from bigint,
    p_messages text[])
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_old bigint;
    n integer := coalesce(array_length(p_messages, 1), 0);
BEGIN
    SELECT coalesce(sum(octet_length(message)), 0) INTO v_old FROM t_agent_state_message
    WHERE user_id = p_user_id AND session_id = p_session_id AND state_key = p_state_key
      AND position >= p_start + p_from;
    IF n > 0 THEN
        INSERT INTO t_agent_state_message AS m (user_id, session_id, state_key, position, message)
        SELECT p_user_id, p_session_id, p_state_key, p_start + p_from + u.i - 1, u.message
        FROM unnest(p_messages) WITH ORDINALITY AS u(message, i)
        ON CONFLICT (session_id, state_key, position)
        DO UPDATE SET message = EXCLUDED.message WHERE m.message <> EXCLUDED.message;
    END IF;
    IF v_old > 0 THEN
        DELETE FROM t_agent_state_message
        WHERE user_id = p_user_id AND session_id = p_session_id AND state_key = p_state_key
          AND position >= p_start + p_from + n;
    END IF;
    RETURN v_old;
END $$;

-- Split a state stored whole into rows (the caller holds the conversation's row
-- lock and the state row's). The version does not change: the state is the
-- same. Returns the row after the split, or the row unchanged when its
-- "context" is absent (an empty context, when p_absent_is_empty) or not an array.
CREATE FUNCTION agentstate_split_state(s t_agent_state, p_absent_is_empty boolean)
RETURNS t_agent_state
LANGUAGE plpgsql AS $$
DECLARE
    v_context jsonb := s.payload->'context';
    v_messages text[];
BEGIN
    IF s.context_start IS NOT NULL THEN
        RETURN s;
    END IF;
    IF v_context IS NULL AND p_absent_is_empty THEN
        v_context := '[]';
    ELSIF jsonb_typeof(v_context) IS DISTINCT FROM 'array' THEN
        RETURN s;
    END IF;
    SELECT coalesce(array_agg(e.value::text ORDER BY e.i), '{}') INTO v_messages
    FROM jsonb_array_elements(v_context) WITH ORDINALITY AS e(value, i);
    PERFORM agentstate_write_context(s.user_id, s.session_id, s.state_key, 0, 0, v_messages);
    UPDATE t_agent_state AS t
    SET payload = t.payload - 'context', context_start = 0,
        context_count = cardinality(v_messages),
        context_bytes = (SELECT coalesce(sum(octet_length(m)), 0) FROM unnest(v_messages) AS m),
        (context_head, context_tail) = (
            SELECT f.head, f.tail FROM agentstate_state_frame(t.payload - 'context') AS f)
    WHERE t.user_id = s.user_id AND t.session_id = s.session_id AND t.state_key = s.state_key
    RETURNING * INTO s;
    RETURN s;
END $$;

-- UpsertState and EndTurn. A whole payload (p_payload) or a delta (p_base_version
-- set: p_drop_head, p_replace_from, p_messages, p_fields; see StateDelta in the
-- contract), then the message writes and the compaction records, and for
-- EndTurn (p_task_id set) the lease fence and release. One row per message
-- written, in order (one row of NULL message columns when there are none), each
-- carrying the state's result.
DROP FUNCTION agentstate_save_state(
    text, bigint, text, jsonb, bigint, bigint, text[], bigint[], text[], text[], text[], text[],
    text[], bigint[], text[], integer);
CREATE FUNCTION agentstate_save_state(
    p_user_id text, p_conversation_id bigint, p_state_key text, p_payload jsonb,
    p_expected_version bigint, p_task_id bigint,
    p_kinds text[], p_message_ids bigint[], p_roles text[], p_statuses text[],
    p_blocks text[], p_metadata text[], p_expected_statuses text[],
    p_compactions bigint[], p_compaction_reasons text[], p_max_depth integer,
    p_base_version bigint DEFAULT NULL, p_drop_head integer DEFAULT 0,
    p_replace_from integer DEFAULT NULL, p_messages text[] DEFAULT NULL,
    p_fields jsonb DEFAULT NULL, p_max_bytes bigint DEFAULT NULL)
RETURNS TABLE (version bigint, state_update_time timestamptz, lease_released boolean,
               message t_agent_message)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_state t_agent_state;
    v_current bigint;
    v_released boolean := false;
    v_row t_agent_message;
    v_written integer := 0;
    v_rest jsonb;
    v_start bigint;
    v_count integer;
    v_bytes bigint;
    v_new text[];
    v_new_bytes bigint;
    v_size bigint;
    v_from integer;
    v_frame record;
BEGIN
    -- Set only for a large payload with many brackets (the store checks small ones):
    -- is any value nested deeper than allowed?
    IF p_max_depth IS NOT NULL
       AND jsonb_path_exists(p_payload, format('strict $.**{%s}', p_max_depth + 1)::jsonpath)
    THEN
        PERFORM agentstate_refuse(jsonb_build_object('kind', 'too_deep', 'limit', p_max_depth));
    END IF;
    SELECT NULL::text AS head, NULL::text AS tail INTO v_frame;
    PERFORM agentstate_touch_conversation(p_user_id, p_conversation_id);
    IF p_task_id IS NOT NULL THEN
        -- Fencing (migration 6): a turn whose lease another task took over never
        -- writes again, whether or not the lease is free now.
        PERFORM agentstate_fence_turn(p_user_id, p_conversation_id, p_task_id);
    END IF;
    -- FOR UPDATE: the batched split (agentstate_split_states) may hold it.
    SELECT * INTO v_state FROM t_agent_state AS s
    WHERE s.user_id = p_user_id AND s.session_id = p_conversation_id
      AND s.state_key = p_state_key
    FOR UPDATE;
    v_current := coalesce(v_state.version, 0);
    IF (p_base_version IS NOT NULL AND p_base_version <> v_current)
       OR (p_base_version IS NULL AND p_expected_version IS NOT NULL
           AND p_expected_version <> v_current) THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'version_conflict', 'expected', coalesce(p_base_version, p_expected_version),
            'current', v_current));
    END IF;
    IF p_base_version IS NULL THEN
        -- A whole state. Its "context", when an array, goes to rows (positions kept,
        -- unchanged rows not rewritten); otherwise the payload is kept whole.
        v_start := coalesce(v_state.context_start, 0);
        IF jsonb_typeof(p_payload->'context') = 'array' THEN
            SELECT coalesce(array_agg(e.value::text ORDER BY e.i), '{}') INTO v_new
            FROM jsonb_array_elements(p_payload->'context') WITH ORDINALITY AS e(value, i);
            PERFORM agentstate_write_context(
                p_user_id, p_conversation_id, p_state_key, v_start, 0, v_new);
            v_rest := p_payload - 'context';
            v_frame := agentstate_state_frame(v_rest);
            v_count := cardinality(v_new);
            SELECT coalesce(sum(octet_length(m)), 0) INTO v_bytes FROM unnest(v_new) AS m;
        ELSE
            IF v_state.context_start IS NOT NULL THEN
                DELETE FROM t_agent_state_message AS m
                WHERE m.user_id = p_user_id AND m.session_id = p_conversation_id
                  AND m.state_key = p_state_key;
            END IF;
            v_rest := p_payload;
            v_start := NULL;
        END IF;
    ELSE
        -- A delta on the stored version (see StateDelta).
        IF v_state.context_start IS NULL THEN
            v_state := agentstate_split_state(v_state, true);
            IF v_state.context_start IS NULL THEN
                PERFORM agentstate_refuse(jsonb_build_object('kind', 'context_not_array'));
            END IF;
        END IF;
        v_start := v_state.context_start;
        v_count := v_state.context_count;
        v_bytes := v_state.context_bytes;
        v_rest := v_state.payload;
        SELECT v_state.context_head AS head, v_state.context_tail AS tail INTO v_frame;
        IF p_drop_head > v_count THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'delta_range', 'field', 'drop_head', 'value', p_drop_head,
                'length', v_count));
        END IF;
        IF p_drop_head > 0 THEN
            WITH dropped AS (
                DELETE FROM t_agent_state_message AS m
                WHERE m.user_id = p_user_id AND m.session_id = p_conversation_id
                  AND m.state_key = p_state_key AND m.position < v_start + p_drop_head
                RETURNING octet_length(m.message) AS size)
            SELECT v_bytes - coalesce(sum(size), 0) INTO v_bytes FROM dropped;
            v_start := v_start + p_drop_head;
            v_count := v_count - p_drop_head;
        END IF;
        v_from := coalesce(p_replace_from, v_count);
        IF v_from > v_count THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'delta_range', 'field', 'replace_from', 'value', v_from,
                'length', v_count));
        END IF;
        -- Each message parsed (a bad one fails the statement: the store names it)
        -- and kept as jsonb prints it.
        SELECT coalesce(array_agg(u.m::jsonb::text ORDER BY u.i), '{}') INTO v_new
        FROM unnest(p_messages) WITH ORDINALITY AS u(m, i);
        SELECT coalesce(sum(octet_length(m)), 0) INTO v_new_bytes FROM unnest(v_new) AS m;
        IF v_from = v_count THEN
            -- Appending (the common turn): no row after the end to compare or remove.
            INSERT INTO t_agent_state_message (user_id, session_id, state_key, position, message)
            SELECT p_user_id, p_conversation_id, p_state_key, v_start + v_count + u.i - 1,
                   u.message
            FROM unnest(v_new) WITH ORDINALITY AS u(message, i);
            v_bytes := v_bytes + v_new_bytes;
        ELSE
            v_bytes := v_bytes - agentstate_write_context(
                p_user_id, p_conversation_id, p_state_key, v_start, v_from, v_new) + v_new_bytes;
        END IF;
        v_count := v_from + cardinality(v_new);
        IF p_fields IS NOT NULL THEN
            IF jsonb_typeof(p_fields) <> 'object' THEN
                PERFORM agentstate_refuse(jsonb_build_object('kind', 'fields_not_object'));
            END IF;
            IF p_fields ? 'context' THEN
                PERFORM agentstate_refuse(jsonb_build_object('kind', 'fields_name_context'));
            END IF;
            v_rest := p_fields;
            v_frame := agentstate_state_frame(v_rest);
        END IF;
        IF p_max_bytes IS NOT NULL THEN
            -- The size of the whole state as GetState returns it.
            v_size := octet_length(v_frame.head) + octet_length(v_frame.tail)
                      + CASE WHEN v_count = 0 THEN 2 ELSE v_bytes + 2 * v_count END;
            IF v_size > p_max_bytes THEN
                PERFORM agentstate_refuse(jsonb_build_object(
                    'kind', 'too_large', 'size', v_size, 'limit', p_max_bytes));
            END IF;
        END IF;
    END IF;
    IF v_state.version IS NULL THEN
        INSERT INTO t_agent_state AS s (user_id, session_id, state_key, payload, version,
                                        context_start, context_count, context_bytes,
                                        context_head, context_tail)
        VALUES (p_user_id, p_conversation_id, p_state_key, v_rest, 1, v_start,
                CASE WHEN v_start IS NULL THEN NULL ELSE v_count END,
                CASE WHEN v_start IS NULL THEN NULL ELSE v_bytes END,
                CASE WHEN v_start IS NULL THEN NULL ELSE v_frame.head END,
                CASE WHEN v_start IS NULL THEN NULL ELSE v_frame.tail END)
        RETURNING s.* INTO v_state;
    ELSE
        UPDATE t_agent_state AS s
        SET payload = v_rest, version = s.version + 1, update_time = now(),
            context_start = v_start,
            context_count = CASE WHEN v_start IS NULL THEN NULL ELSE v_count END,
            context_bytes = CASE WHEN v_start IS NULL THEN NULL ELSE v_bytes END,
            context_head = CASE WHEN v_start IS NULL THEN NULL ELSE v_frame.head END,
            context_tail = CASE WHEN v_start IS NULL THEN NULL ELSE v_frame.tail END
        WHERE s.user_id = p_user_id AND s.session_id = p_conversation_id
          AND s.state_key = p_state_key
        RETURNING s.* INTO v_state;
    END IF;
    -- Compactions: five numbers each, flattened (see sql.py), and a reason.
    INSERT INTO t_context_compaction (user_id, conversation_id, messages_before, messages_after,
                                      tokens_before, tokens_after, summary_chars, reason)
    SELECT p_user_id, p_conversation_id, p_compactions[i * 5 + 1], p_compactions[i * 5 + 2],
           p_compactions[i * 5 + 3], p_compactions[i * 5 + 4], p_compactions[i * 5 + 5],
           p_compaction_reasons[i + 1]
    FROM generate_series(0, coalesce(array_length(p_compaction_reasons, 1), 0) - 1) AS i
    ORDER BY i;
    IF p_task_id IS NOT NULL THEN
        DELETE FROM t_run_lease WHERE conversation_id = p_conversation_id AND task_id = p_task_id;
        v_released := FOUND;
    END IF;
    FOR v_row IN
        SELECT * FROM agentstate_write_messages(
            p_user_id, p_conversation_id, p_kinds, p_message_ids, p_roles, p_statuses, p_blocks,
            p_metadata, p_expected_statuses)
    LOOP
        v_written := v_written + 1;
        RETURN QUERY SELECT v_state.version, v_state.update_time, v_released, v_row;
    END LOOP;
    IF v_written = 0 THEN
        RETURN QUERY SELECT v_state.version, v_state.update_time, v_released,
                            NULL::t_agent_message;
    END IF;
END $$;

-- BeginTurn, as in migration 5, returning the whole state as text (assembled
-- from its rows) and nothing when the caller already holds the stored version
-- (p_cached_version).
DROP FUNCTION agentstate_begin_turn(
    text, bigint, text, text, text, integer, integer, boolean, bigint, text[], text[], text[],
    text[]);
CREATE FUNCTION agentstate_begin_turn(
    p_user_id text, p_conversation_id bigint, p_title text, p_state_key text,
    p_holder text, p_ttl_ms integer, p_max_user_leases integer,
    p_require_none_awaiting boolean, p_require_awaiting_message_id bigint,
    p_roles text[], p_statuses text[], p_blocks text[], p_metadata text[],
    p_cached_version bigint DEFAULT NULL)
RETURNS TABLE (conversation t_conversation, conversation_created boolean,
               task_id bigint, expire_time timestamptz, stop_requested boolean,
               lapsed_task_id bigint, interrupted_records integer,
               payload text, version bigint, state_update_time timestamptz,
               message_ids bigint[], message_time timestamptz, payload_omitted boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_conversation t_conversation;
    v_created boolean := p_conversation_id IS NULL;
    v_lease record;
    v_awaiting bigint;
    v_status text;
    v_interrupted integer;
    v_ids bigint[];
    n integer := coalesce(array_length(p_roles, 1), 0);
BEGIN
    IF v_created THEN
        INSERT INTO t_conversation (user_id, title) VALUES (p_user_id, p_title)
        RETURNING * INTO v_conversation;
    ELSE
        v_conversation := agentstate_touch_conversation(p_user_id, p_conversation_id);
    END IF;
    SELECT * INTO v_lease FROM agentstate_take_lease(
        p_user_id, v_conversation.id, p_holder, p_ttl_ms, p_max_user_leases);
    IF p_require_none_awaiting THEN
        SELECT id INTO v_awaiting FROM t_agent_message
        WHERE user_id = p_user_id AND conversation_id = v_conversation.id
          AND status = 'AWAITING_CONFIRM'
        ORDER BY id LIMIT 1;
        IF FOUND THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'card_pending', 'message_id', v_awaiting));
        END IF;
    ELSIF p_require_awaiting_message_id IS NOT NULL THEN
        SELECT status INTO v_status FROM t_agent_message
        WHERE user_id = p_user_id AND conversation_id = v_conversation.id
          AND id = p_require_awaiting_message_id;
        IF NOT FOUND THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'not_found', 'missing', 'message',
                'message_id', p_require_awaiting_message_id,
                'conversation_id', v_conversation.id));
        ELSIF v_status <> 'AWAITING_CONFIRM' THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'not_awaiting', 'message_id', p_require_awaiting_message_id,
                'status', v_status));
        END IF;
    END IF;
    -- Holding the lease means no turn runs: a record still STREAMING is a dead turn's.
    UPDATE t_agent_message SET status = 'INTERRUPTED', update_time = now()
    WHERE user_id = p_user_id AND conversation_id = v_conversation.id AND status = 'STREAMING';
    GET DIAGNOSTICS v_interrupted = ROW_COUNT;
    SELECT array_agg(m.id ORDER BY m.ordinality) INTO v_ids FROM agentstate_write_messages(
        p_user_id, v_conversation.id, array_fill('insert'::text, ARRAY[n]),
        array_fill(NULL::bigint, ARRAY[n]), p_roles, p_statuses, p_blocks, p_metadata,
        array_fill(NULL::text, ARRAY[n])) WITH ORDINALITY AS m;
    RETURN QUERY
    SELECT v_conversation, v_created, v_lease.task_id, v_lease.expire_time,
           v_lease.stop_requested, v_lease.lapsed_task_id, v_interrupted,
           -- As sql.SELECT_STATE: written out, not a function, so it is planned once.
           CASE WHEN s.version = p_cached_version THEN NULL
                WHEN s.context_start IS NULL THEN s.payload::text
                ELSE s.context_head || (
                    SELECT coalesce(
                        '[' || string_agg(m.message, ', ' ORDER BY m.position) || ']', '[]')
                    FROM t_agent_state_message AS m
                    WHERE m.session_id = s.session_id AND m.state_key = s.state_key
                      AND m.user_id = s.user_id) || s.context_tail END,
           s.version, s.update_time, coalesce(v_ids, '{}'), now(),
           coalesce(s.version = p_cached_version, false)
    FROM (SELECT 1) AS one
    LEFT JOIN t_agent_state AS s
      ON s.user_id = p_user_id AND s.session_id = v_conversation.id
     AND s.state_key = p_state_key;
END $$;
""",
    ),
    Migration(
        11,
        "delta saves: split the states stored whole, in batches, online",
        """
-- Split up to p_batch states stored whole whose "context" is an array, after the
-- key (p_user_id, p_session_id, p_state_key) (NULLs: from the start), in key
-- order. Each call is one short transaction: it takes the conversation's row
-- lock as every writer does (NO KEY UPDATE, so the order is the writers' and a
-- delete waits for it or it skips), skipping rows someone holds, so it runs
-- beside live traffic. The state's version and JSON do not change. Returns how
-- many it split and the last key it looked at (NULL when it reached the end).
CREATE FUNCTION agentstate_split_states(
    p_batch integer, p_user_id text, p_session_id bigint, p_state_key text,
    OUT split integer, OUT skipped integer,
    OUT last_user_id text, OUT last_session_id bigint, OUT last_state_key text)
LANGUAGE plpgsql AS $$
DECLARE
    v_state t_agent_state;
    v_seen integer := 0;
BEGIN
    split := 0;
    skipped := 0;
    FOR v_state IN
        SELECT s.* FROM t_agent_state AS s
        JOIN t_conversation AS c ON c.user_id = s.user_id AND c.id = s.session_id
        WHERE s.context_start IS NULL
          AND (p_user_id IS NULL
               OR (s.user_id, s.session_id, s.state_key) > (p_user_id, p_session_id, p_state_key))
        ORDER BY s.user_id, s.session_id, s.state_key
        LIMIT p_batch
        FOR NO KEY UPDATE OF c, s SKIP LOCKED
    LOOP
        v_seen := v_seen + 1;
        last_user_id := v_state.user_id;
        last_session_id := v_state.session_id;
        last_state_key := v_state.state_key;
        IF (agentstate_split_state(v_state, false)).context_start IS NULL THEN
            skipped := skipped + 1;  -- no "context" array: stays whole
        ELSE
            split := split + 1;
        END IF;
    END LOOP;
    IF v_seen < p_batch THEN
        last_user_id := NULL;
        last_session_id := NULL;
        last_state_key := NULL;
    END IF;
END $$;
""",
    ),
]


class MigrationLockTimeout(RuntimeError):
    """The migration lock (or a table a migration alters) was not free in time."""


async def apply_migrations(
    conn: psycopg.AsyncConnection[Any], *, lock_timeout: float | None = None
) -> list[int]:
    """Apply missing migrations in order; return the versions applied now.

    `lock_timeout` (seconds) bounds every lock wait: the migration lock another migrator
    holds, and the table locks the migrations take (an ALTER TABLE queued behind a long
    transaction would otherwise block every query on that table while it waits). Past it,
    MigrationLockTimeout and nothing is applied. The lock and the setting are
    transaction-scoped, so this works through a transaction pooler too."""
    applied_now: list[int] = []
    async with conn.transaction():
        if lock_timeout is not None:
            await conn.execute(
                "SELECT set_config('lock_timeout', %s, true)", (f"{int(lock_timeout * 1000)}ms",)
            )
        try:
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_ID,))
        except psycopg.errors.LockNotAvailable:
            raise MigrationLockTimeout(
                f"the migration lock was not free within {lock_timeout:g}s: another "
                "process is migrating this database (or died holding a transaction open)"
            ) from None
        await conn.execute(CREATE_MIGRATIONS_TABLE)
        cur = conn.cursor(row_factory=tuple_row)
        await cur.execute("SELECT version FROM agentstate_schema_migrations")
        done = {int(row[0]) for row in await cur.fetchall()}
        for migration in sorted(MIGRATIONS, key=lambda m: m.version):
            if migration.version in done:
                continue
            try:
                await conn.execute(migration.sql.encode())
            except psycopg.errors.LockNotAvailable as exc:
                raise MigrationLockTimeout(
                    f"migration {migration.version} could not lock a table within "
                    f"{lock_timeout:g}s ({exc.diag.message_primary}); nothing was applied"
                ) from None
            await conn.execute(
                "INSERT INTO agentstate_schema_migrations (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied_now.append(migration.version)
    return applied_now
