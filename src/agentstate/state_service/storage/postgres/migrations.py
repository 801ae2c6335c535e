"""Ordered, versioned schema migrations, and the SQL functions they install.

Append new migrations at the end; never edit an applied one. `apply_migrations`
runs the missing ones in order, each recorded in `agentstate_schema_migrations`,
under a transaction-scoped advisory lock so two replicas starting at once (or a
`migrate` command beside a starting server) apply each migration exactly once.

Every PL/pgSQL function lives in its own file, functions/NAME.sql (CREATE OR REPLACE),
and a migration installs it by name where the schema first needs it, with a line
`\\ir functions/NAME.sql` (psql's include). Whatever the path a database took, it
ends with the files' text: after the migrations, every function whose file changed
since it was installed (sha-256 in `agentstate_schema_functions`) is installed again.
So a change to a function's body is an edit of its file, nothing more; a change to its
arguments or result type also needs a migration that drops the old signature
(tests/state_service/test_migrations.py checks that the catalog equals the files).
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import psycopg
import psycopg.errors
from psycopg.rows import tuple_row

log = logging.getLogger(__name__)

FUNCTIONS_DIR = Path(__file__).with_name("functions")
_INCLUDE = re.compile(r"^\\ir functions/(agentstate_\w+)\.sql$", re.MULTILINE)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str  # may include functions by name: a line `\ir functions/NAME.sql`

    def functions(self) -> list[str]:
        """The functions this migration installs, in order."""
        return _INCLUDE.findall(self.sql)

    def expanded(self) -> str:
        """The SQL to run: each include replaced by its file's text."""
        return _INCLUDE.sub(lambda m: function_sql(m.group(1)), self.sql)


@cache
def function_sql(name: str) -> str:
    """The text of functions/NAME.sql (one CREATE OR REPLACE FUNCTION)."""
    return (FUNCTIONS_DIR / f"{name}.sql").read_text()


def function_names() -> list[str]:
    return sorted(path.stem for path in FUNCTIONS_DIR.glob("agentstate_*.sql"))


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# Arbitrary constant: the advisory lock that serialises migrators.
MIGRATION_LOCK_ID = 0x6167_7374_6174_6531  # "agstate1"

CREATE_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS agentstate_schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS agentstate_schema_functions (
    name          text PRIMARY KEY,
    sha256        text NOT NULL,
    installed_at  timestamptz NOT NULL DEFAULT now()
)
"""

RECORD_FUNCTION = """
INSERT INTO agentstate_schema_functions (name, sha256) VALUES (%s, %s)
ON CONFLICT (name) DO UPDATE SET sha256 = EXCLUDED.sha256, installed_at = now()
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
\\ir functions/agentstate_next_id.sql

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
\\ir functions/agentstate_refuse.sql

-- Records that a turn still has open (its STREAMING reply) or that wait for a
-- confirmation: found without scanning a long conversation's records.
CREATE INDEX t_agent_message_open_idx ON t_agent_message (user_id, conversation_id)
    WHERE status IN ('STREAMING', 'AWAITING_CONFIRM');

\\ir functions/agentstate_touch_conversation.sql

\\ir functions/agentstate_take_lease.sql

\\ir functions/agentstate_acquire_lease.sql

\\ir functions/agentstate_write_messages.sql

\\ir functions/agentstate_save_state.sql

\\ir functions/agentstate_begin_turn.sql

\\ir functions/agentstate_delete_conversations.sql

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

\\ir functions/agentstate_record_lease_task.sql
CREATE TRIGGER t_run_lease_record_task AFTER INSERT OR UPDATE OF task_id ON t_run_lease
FOR EACH ROW EXECUTE FUNCTION agentstate_record_lease_task();

\\ir functions/agentstate_fence_turn.sql

\\ir functions/agentstate_save_state.sql
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

\\ir functions/agentstate_put_checkpoint.sql

\\ir functions/agentstate_put_checkpoint_writes.sql

\\ir functions/agentstate_checkpoint_gc.sql

\\ir functions/agentstate_delete_checkpoints_for_runs.sql

\\ir functions/agentstate_copy_checkpoints.sql

\\ir functions/agentstate_prune_checkpoints.sql
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

\\ir functions/agentstate_lock_items.sql

\\ir functions/agentstate_append_items.sql

\\ir functions/agentstate_pop_item.sql

\\ir functions/agentstate_clear_items.sql

\\ir functions/agentstate_merge_scoped_state.sql

\\ir functions/agentstate_append_event.sql
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

\\ir functions/agentstate_state_frame.sql

\\ir functions/agentstate_state_text.sql

\\ir functions/agentstate_write_context.sql

\\ir functions/agentstate_split_state.sql

-- UpsertState and EndTurn. A whole payload (p_payload) or a delta (p_base_version
-- set: p_drop_head, p_replace_from, p_messages, p_fields; see StateDelta in the
-- contract), then the message writes and the compaction records, and for
-- EndTurn (p_task_id set) the lease fence and release. One row per message
-- written, in order (one row of NULL message columns when there are none), each
-- carrying the state's result.
DROP FUNCTION IF EXISTS agentstate_save_state(
    text, bigint, text, jsonb, bigint, bigint, text[], bigint[], text[], text[], text[], text[],
    text[], bigint[], text[], integer);
\\ir functions/agentstate_save_state.sql

-- BeginTurn, as in migration 5, returning the whole state as text (assembled
-- from its rows) and nothing when the caller already holds the stored version
-- (p_cached_version).
DROP FUNCTION IF EXISTS agentstate_begin_turn(
    text, bigint, text, text, text, integer, integer, boolean, bigint, text[], text[], text[],
    text[]);
\\ir functions/agentstate_begin_turn.sql
""",
    ),
    Migration(
        11,
        "delta saves: split the states stored whole, in batches, online",
        """
\\ir functions/agentstate_split_states.sql
""",
    ),
    # Issue 22: payloads kept as the caller sent them (domain/jsontext.py). jsonb
    # refuses \u0000 and rewrites numbers and key order, so new writes go to text
    # columns; rows written before keep their jsonb (whose text is what they read
    # back before) and are read from it until they are next written. Every step is
    # a catalog change: no table is rewritten or scanned under a lock.
    Migration(
        12,
        "faithful payloads: items, scoped states, checkpoint metadata and states as text",
        """
-- An item's text as sent (NULL for items written before: `item` holds them).
ALTER TABLE t_conversation_item ALTER COLUMN item DROP NOT NULL,
    ADD COLUMN item_text text;
ALTER TABLE t_conversation_item ADD CONSTRAINT t_conversation_item_text_check
    CHECK (item IS NOT NULL OR item_text IS NOT NULL) NOT VALID;

-- A merged state (scoped, or an ADK session's) as its top-level members: each key's
-- JSON spelling and each value's text as sent, in dict.update order, so a merge
-- replaces the values it names and copies the others byte for byte. `payload` stays
-- for rows written before (converted on their next merge).
ALTER TABLE t_scoped_state ALTER COLUMN payload DROP NOT NULL,
    ADD COLUMN member_keys text[], ADD COLUMN member_values text[];
ALTER TABLE t_scoped_state ADD CONSTRAINT t_scoped_state_members_check
    CHECK ((payload IS NOT NULL OR member_keys IS NOT NULL)
           AND cardinality(member_keys) IS NOT DISTINCT FROM cardinality(member_values))
    NOT VALID;

-- A state stored whole is its members (as above); one whose "context" is an array
-- is split as in migration 10, its head and tail made from the members' texts in
-- the order sent. `payload` is NULL for both once written after this migration.
ALTER TABLE t_agent_state ALTER COLUMN payload DROP NOT NULL,
    ADD COLUMN member_keys text[], ADD COLUMN member_values text[];
ALTER TABLE t_agent_state ADD CONSTRAINT t_agent_state_members_check
    CHECK ((payload IS NOT NULL OR member_keys IS NOT NULL OR context_start IS NOT NULL)
           AND cardinality(member_keys) IS NOT DISTINCT FROM cardinality(member_values))
    NOT VALID;

-- The metadata's text as sent; `metadata` stays as the copy that filters (@>) and
-- run_id read, without the values jsonb cannot hold (see checkpoint_search_copy).
ALTER TABLE t_checkpoint ADD COLUMN metadata_text text;

DROP FUNCTION IF EXISTS agentstate_append_items(text, bigint, text[], timestamptz[], bigint);
\\ir functions/agentstate_append_items.sql

DROP FUNCTION IF EXISTS agentstate_pop_item(text, bigint, bigint);
\\ir functions/agentstate_pop_item.sql

DROP FUNCTION IF EXISTS agentstate_merge_scoped_state(text, text, jsonb);
\\ir functions/agentstate_merge_members.sql
\\ir functions/agentstate_members_text.sql
\\ir functions/agentstate_merge_scoped_state.sql

DROP FUNCTION IF EXISTS agentstate_append_event(
    text, bigint, text, timestamptz, bigint, text, jsonb, text, jsonb, jsonb);
\\ir functions/agentstate_append_event.sql

DROP FUNCTION IF EXISTS agentstate_put_checkpoint(
    text, bigint, text, text, text, text, bytea, jsonb, jsonb, boolean, text,
    text[], text[], text[], bytea[]);
\\ir functions/agentstate_put_checkpoint.sql
\\ir functions/agentstate_copy_checkpoints.sql

\\ir functions/agentstate_begin_turn.sql
DROP FUNCTION IF EXISTS agentstate_save_state(
    text, bigint, text, jsonb, bigint, bigint, text[], bigint[], text[], text[], text[], text[],
    text[], bigint[], text[], integer, bigint, integer, integer, text[], jsonb, bigint);
\\ir functions/agentstate_save_state.sql
""",
    ),
    # Issue 23 (lifecycle). Number 13: 12 is another change's; this one touches no
    # payload column, so the two apply in either order.
    Migration(
        13,
        "data lifecycle: labels, time to live, erasure of a user with receipts",
        """
-- Labels (a small string map) and a time to live per conversation. Constant
-- defaults and NULL columns: no table rewrite.
ALTER TABLE t_conversation
    ADD COLUMN labels jsonb NOT NULL DEFAULT '{}'
        CHECK (jsonb_typeof(labels) = 'object'),
    ADD COLUMN ttl_seconds bigint CHECK (ttl_seconds > 0),
    ADD COLUMN ttl_renew boolean NOT NULL DEFAULT false,
    ADD COLUMN expire_time timestamptz;
-- The labels again as rows, kept by a trigger: a page of a label's conversations
-- walks (user_id, key, value, conversation_id) backwards and stops at the page.
CREATE TABLE t_conversation_label (
    user_id         text NOT NULL,
    key             text NOT NULL,
    value           text NOT NULL,
    conversation_id bigint NOT NULL,
    PRIMARY KEY (user_id, key, value, conversation_id),
    CONSTRAINT t_conversation_label_conversation_fkey FOREIGN KEY (user_id, conversation_id)
        REFERENCES t_conversation (user_id, id) ON DELETE CASCADE
);
-- The cascade from t_conversation and a relabelling find a conversation's rows.
CREATE INDEX t_conversation_label_conversation_idx
    ON t_conversation_label (user_id, conversation_id);
\\ir functions/agentstate_index_labels.sql
CREATE TRIGGER t_conversation_index_labels AFTER INSERT ON t_conversation
FOR EACH ROW WHEN (NEW.labels <> '{}') EXECUTE FUNCTION agentstate_index_labels();
CREATE TRIGGER t_conversation_reindex_labels AFTER UPDATE OF labels ON t_conversation
FOR EACH ROW WHEN (OLD.labels IS DISTINCT FROM NEW.labels)
EXECUTE FUNCTION agentstate_index_labels();
-- The sweep of expired conversations.
CREATE INDEX t_conversation_expire_idx ON t_conversation (expire_time)
    WHERE expire_time IS NOT NULL;
-- Listing by key prefix (an adapter's namespace) under byte order.
CREATE INDEX t_conversation_key_prefix_idx
    ON t_conversation (user_id, external_key text_pattern_ops)
    WHERE external_key IS NOT NULL;

\\ir functions/agentstate_renew_ttl.sql
CREATE TRIGGER t_conversation_renew_ttl BEFORE UPDATE OF update_time ON t_conversation
FOR EACH ROW WHEN (NEW.ttl_renew AND NEW.ttl_seconds IS NOT NULL)
EXECUTE FUNCTION agentstate_renew_ttl();

-- Erasures of users. A receipt holds no user content and no user id: user_hash
-- is the sha-256 of the user id, so a later call for the same user finds it.
CREATE TABLE t_erasure (
    id             bigint PRIMARY KEY DEFAULT agentstate_next_id(),
    user_hash      text NOT NULL,
    done           boolean NOT NULL DEFAULT false,
    counts         jsonb NOT NULL DEFAULT '{}',
    start_time     timestamptz NOT NULL DEFAULT now(),
    end_time       timestamptz,
    heartbeat_time timestamptz NOT NULL DEFAULT now()
);
-- One running erasure per user.
CREATE UNIQUE INDEX t_erasure_running_idx ON t_erasure (user_hash) WHERE NOT done;
CREATE INDEX t_erasure_user_idx ON t_erasure (user_hash, id);

-- While a user's erase runs: no new row of the user (agentstate_erasure_fence).
CREATE TABLE t_erasure_fence (
    user_id    text PRIMARY KEY,
    erasure_id bigint NOT NULL
);

\\ir functions/agentstate_erasure_fence.sql
CREATE TRIGGER t_conversation_erasure_fence BEFORE INSERT ON t_conversation
FOR EACH ROW EXECUTE FUNCTION agentstate_erasure_fence();
CREATE TRIGGER t_scoped_state_erasure_fence BEFORE INSERT ON t_scoped_state
FOR EACH ROW WHEN (NEW.user_id <> '') EXECUTE FUNCTION agentstate_erasure_fence();

\\ir functions/agentstate_erase_begin.sql

\\ir functions/agentstate_erase_batch.sql
""",
    ),
    # Issue 24 item 5 (encryption at rest). Number 14: 15-18 are other changes'; this
    # one adds a table and a function, so it applies beside them in either order.
    Migration(
        14,
        "encryption at rest: the users' wrapped data keys",
        """
-- One data key per user, wrapped by a key-encryption key (kek_id names it in the key
-- file); key_id is in every token the key seals. Erasing the user deletes the row
-- (crypto-shredding); agentstate-state rotate-keys rewraps rows by kek_id.
CREATE TABLE t_user_key (
    user_id     text PRIMARY KEY,
    key_id      bytea NOT NULL,
    kek_id      text NOT NULL,
    wrapped     bytea NOT NULL,
    create_time timestamptz NOT NULL DEFAULT now(),
    wrap_time   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX t_user_key_kek_idx ON t_user_key (kek_id, user_id);
-- No key is made for a user whose erase runs (the erase deletes the key last).
CREATE TRIGGER t_user_key_erasure_fence BEFORE INSERT ON t_user_key
FOR EACH ROW EXECUTE FUNCTION agentstate_erasure_fence();
\\ir functions/agentstate_plain_length.sql
""",
    ),
    # Issue 26 (small states, compressed storage). Number 16: 14 and 15 are other
    # changes'; this one only adds a column and changes compression settings, so the
    # three apply in any order.
    Migration(
        16,
        "state messages in chunks, compressed with lz4",
        """
-- A row of t_agent_state_message holds a chunk: the messages from `position` on, in
-- `messages` (about 8 KB of text at most, see agentstate_write_context), so a small
-- state is one row and a row is large enough for PostgreSQL to compress (it tries
-- only above about 2 KB a row, whatever toast_tuple_target says). Rows written
-- before hold one message in `message`; they stay readable and are replaced by chunks
-- as their state is written. No table is rewritten.
ALTER TABLE t_agent_state_message ALTER COLUMN message DROP NOT NULL,
    ADD COLUMN messages text[];
ALTER TABLE t_agent_state_message ADD CONSTRAINT t_agent_state_message_chunk_check
    CHECK ((message IS NULL) <> (messages IS NULL) AND cardinality(messages) > 0) NOT VALID;
-- A chunk stays in its row, compressed (MAIN: out of line only if a row cannot fit a
-- page), and a fifth of each new page is left free: an append that refills the last
-- chunk is then often a HOT update in place, whose dead version the next update of the
-- page prunes without waiting for vacuum (a TOASTed value's would wait). Measured in
-- bench.small_state: 80 left fewer bytes after 200 turns than 50, 70 or 100.
ALTER TABLE t_agent_state_message ALTER COLUMN messages SET STORAGE MAIN;
ALTER TABLE t_agent_state_message SET (fillfactor = 80);
-- lz4 where the server has it (faster than pglz, to write and to read); new values only.
DO $$
BEGIN
    ALTER TABLE t_agent_state_message ALTER COLUMN messages SET COMPRESSION lz4,
        ALTER COLUMN message SET COMPRESSION lz4;
    ALTER TABLE t_agent_state ALTER COLUMN context_head SET COMPRESSION lz4,
        ALTER COLUMN context_tail SET COMPRESSION lz4,
        ALTER COLUMN member_values SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'no lz4 in this server: state messages keep the default compression';
END $$;

\\ir functions/agentstate_write_context.sql
\\ir functions/agentstate_save_state.sql
\\ir functions/agentstate_begin_turn.sql
""",
    ),
    # Issue 22: a LangGraph step's writes and the run lease in its put's call.
    Migration(
        17,
        "checkpoints: a step's writes and the run lease with its put, one transaction",
        """
\\ir functions/agentstate_put_checkpoint_step.sql
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
                await conn.execute(migration.expanded().encode())
            except psycopg.errors.LockNotAvailable as exc:
                raise MigrationLockTimeout(
                    f"migration {migration.version} could not lock a table within "
                    f"{lock_timeout:g}s ({exc.diag.message_primary}); nothing was applied"
                ) from None
            await conn.execute(
                "INSERT INTO agentstate_schema_migrations (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            for name in migration.functions():
                await conn.execute(RECORD_FUNCTION, (name, _sha256(function_sql(name))))
            applied_now.append(migration.version)
        listed = {name for migration in MIGRATIONS for name in migration.functions()}
        await _install_changed_functions(conn, listed)
    return applied_now


async def _install_changed_functions(conn: psycopg.AsyncConnection[Any], listed: set[str]) -> None:
    """Install every function of the migrations whose file differs from what the database
    last installed (or that it never recorded: one migrated before functions had files)."""
    cur = conn.cursor(row_factory=tuple_row)
    await cur.execute("SELECT name, sha256 FROM agentstate_schema_functions")
    installed = {str(name): str(digest) for name, digest in await cur.fetchall()}
    changed = []
    for name in sorted(listed):
        digest = _sha256(function_sql(name))
        if installed.get(name) != digest:
            await conn.execute(function_sql(name).encode())
            await conn.execute(RECORD_FUNCTION, (name, digest))
            changed.append(name)
    if changed:
        log.info("installed changed SQL functions: %s", ", ".join(changed))
