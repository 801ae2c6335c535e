"""Every SQL statement the PostgreSQL store runs, kept together and named.

Each RPC is ONE statement, so ONE round trip: connections are in autocommit
and every write that needs several steps is a PL/pgSQL function (defined in
migrations.py) whose one statement is its own transaction. Parameters are
named (%(name)s). JSON travels as text. Caller payloads (states, items, deltas,
checkpoint metadata) arrive checked and cut into their stored form by the service
(domain/jsontext.py) and are stored as that text, never as jsonb (migration 12);
message blocks and metadata are text parsed as jsonb inside the functions (so a
bad one is reported by its index). Rows are read by column name.
"""

from typing import Final

# --------------------------------------------------------------- conversations

_CONVERSATION_COLUMNS = (
    "id, user_id, title, create_time, update_time, external_key, "
    "labels::text AS labels, ttl_seconds, ttl_renew, expire_time"
)

# A conversation's status and the time of its last turn, for the row `c` (issue 23):
# index lookups only (the lease's key, the open-records index, the newest record).
STATUS_COLUMNS: Final = """
CASE
    WHEN EXISTS (SELECT 1 FROM t_run_lease AS l
                 WHERE l.user_id = c.user_id AND l.conversation_id = c.id
                   AND l.expire_time > now()) THEN 'RUNNING'
    WHEN EXISTS (SELECT 1 FROM t_agent_message AS m
                 WHERE m.user_id = c.user_id AND m.conversation_id = c.id
                   AND m.status = 'AWAITING_CONFIRM') THEN 'AWAITING_CONFIRMATION'
    WHEN (SELECT m.status FROM t_agent_message AS m
          WHERE m.user_id = c.user_id AND m.conversation_id = c.id
          ORDER BY m.id DESC LIMIT 1) = 'ERROR' THEN 'FAILED'
    ELSE 'IDLE'
END AS status,
(SELECT m.update_time FROM t_agent_message AS m
 WHERE m.user_id = c.user_id AND m.conversation_id = c.id
 ORDER BY m.id DESC LIMIT 1) AS last_turn_time"""

# No row: the external key is another conversation's (NULL keys never conflict).
INSERT_CONVERSATION: Final = f"""
INSERT INTO t_conversation (user_id, title, external_key, labels, ttl_seconds, ttl_renew,
                            expire_time)
VALUES (%(user_id)s, %(title)s, NULLIF(%(external_key)s, ''), %(labels)s::jsonb,
        %(ttl_seconds)s::bigint, %(ttl_renew)s,
        now() + make_interval(secs => %(ttl_seconds)s::bigint))
ON CONFLICT (user_id, external_key) DO NOTHING
RETURNING {_CONVERSATION_COLUMNS}
"""

# ResolveConversation in one statement. The usual case reads the existing row. When
# it is absent, two callers may insert at once: the loser's ON CONFLICT waits for the
# winner and then takes its row (DO UPDATE, unlike DO NOTHING, returns a row committed
# after this statement's snapshot). `created` is true only for a fresh insert
# (xmax = 0). No row: absent and create_if_missing false.
RESOLVE_CONVERSATION: Final = f"""
WITH existing AS (
    SELECT {_CONVERSATION_COLUMNS}, false AS created, {STATUS_COLUMNS}
    FROM t_conversation AS c
    WHERE user_id = %(user_id)s AND external_key = %(external_key)s
), inserted AS (
    INSERT INTO t_conversation (user_id, title, external_key, labels, ttl_seconds, ttl_renew,
                                expire_time)
    SELECT %(user_id)s, %(title)s, %(external_key)s, %(labels)s::jsonb,
           %(ttl_seconds)s::bigint, %(ttl_renew)s,
           now() + make_interval(secs => %(ttl_seconds)s::bigint)
    WHERE %(create_if_missing)s AND NOT EXISTS (SELECT 1 FROM existing)
    ON CONFLICT (user_id, external_key) DO UPDATE SET external_key = EXCLUDED.external_key
    RETURNING {_CONVERSATION_COLUMNS}, (xmax = 0) AS created, 'IDLE' AS status,
              NULL::timestamptz AS last_turn_time
)
SELECT * FROM existing
UNION ALL
SELECT * FROM inserted
"""

SELECT_CONVERSATION: Final = f"""
SELECT {_CONVERSATION_COLUMNS}, {STATUS_COLUMNS}
FROM t_conversation AS c WHERE user_id = %(user_id)s AND id = %(conversation_id)s
"""

LIST_CONVERSATIONS: Final = f"""
SELECT {_CONVERSATION_COLUMNS}, {STATUS_COLUMNS}
FROM t_conversation AS c
WHERE user_id = %(user_id)s AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s
"""

RENAME_CONVERSATION: Final = f"""
UPDATE t_conversation AS c SET title = %(title)s, update_time = now()
WHERE user_id = %(user_id)s AND id = %(conversation_id)s
RETURNING {_CONVERSATION_COLUMNS}, {STATUS_COLUMNS}
"""

# ----------------------------------------------------------------------- state

# No row: no such conversation. A row with a NULL version: no state yet. The
# payload is text (read as raw bytes): a split state is assembled from its rows
# (migration 10), byte for byte what the same state stored whole returns; a whole
# one is its members joined (migration 12), or jsonb's print for a row before it.
# A state's text, from its row `s` (also in LIST_ITEMS_WITH_STATES).
_STATE_TEXT = """CASE
           WHEN s.member_keys IS NOT NULL
               THEN agentstate_members_text(s.member_keys, s.member_values)
           WHEN s.context_start IS NULL THEN s.payload::text
           -- Written out rather than a SQL function (which is planned on every call).
           ELSE s.context_head || (
               SELECT coalesce('[' || string_agg(
                   -- A first chunk may begin before the context (a compaction cut it).
                   coalesce(m.message, array_to_string(CASE WHEN m.position >= s.context_start
                       THEN m.messages ELSE m.messages[s.context_start - m.position + 1 :] END,
                       ', ')), ', '
                   ORDER BY m.position) || ']', '[]')
               FROM t_agent_state_message AS m
               WHERE m.session_id = s.session_id AND m.state_key = s.state_key
                 AND m.user_id = s.user_id) || s.context_tail
       END"""

SELECT_STATE: Final = f"""
SELECT {_STATE_TEXT} AS payload, s.version, s.update_time
FROM t_conversation AS c
LEFT JOIN t_agent_state AS s
  ON s.user_id = c.user_id AND s.session_id = c.id AND s.state_key = %(state_key)s
WHERE c.user_id = %(user_id)s AND c.id = %(conversation_id)s
"""

# The message-write arrays every writing function takes (see agentstate_write_messages).
_WRITES = """
    p_kinds => %(kinds)s::text[], p_message_ids => %(message_ids)s::bigint[],
    p_roles => %(roles)s::text[], p_statuses => %(statuses)s::text[],
    p_blocks => %(blocks)s::text[], p_metadata => %(metadata)s::text[],
    p_expected_statuses => %(expected_statuses)s::text[]"""

_MESSAGE_COLUMNS = (
    "id, conversation_id, user_id, role, blocks, status, metadata, create_time, update_time"
)

# UpsertState (task_id NULL) and EndTurn: one row per message written (NULL
# message columns when none), each with the state's version and time.
SAVE_STATE: Final = f"""
SELECT r.version, r.state_update_time, r.lease_released, (r.message).*
FROM agentstate_save_state(
    p_user_id => %(user_id)s, p_conversation_id => %(conversation_id)s,
    p_state_key => %(state_key)s,
    p_keys => %(keys)s::text[], p_values => %(values)s::text[],
    p_head => %(head)s::text, p_tail => %(tail)s::text, p_context => %(context)s::text[],
    p_expected_version => %(expected_version)s::bigint, p_task_id => %(task_id)s::bigint,
    {_WRITES},
    p_compactions => %(compactions)s::bigint[], p_compaction_reasons => %(reasons)s::text[],
    p_base_version => %(base_version)s::bigint, p_drop_head => %(drop_head)s::integer,
    p_replace_from => %(replace_from)s::integer, p_messages => %(delta_messages)s::text[],
    p_fields_head => %(fields_head)s::text, p_fields_tail => %(fields_tail)s::text,
    p_max_bytes => %(max_bytes)s::bigint
) AS r
"""

BEGIN_TURN: Final = """
SELECT (r.conversation).id AS conversation_id, (r.conversation).title,
       (r.conversation).create_time, (r.conversation).update_time,
       (r.conversation).external_key,
       r.conversation_created, r.task_id, r.expire_time, r.stop_requested, r.lapsed_task_id,
       r.interrupted_records, r.payload, r.version, r.state_update_time,
       r.message_ids, r.message_time, r.payload_omitted
FROM agentstate_begin_turn(
    p_user_id => %(user_id)s, p_conversation_id => %(conversation_id)s::bigint,
    p_title => %(title)s, p_state_key => %(state_key)s, p_holder => %(holder)s,
    p_ttl_ms => %(ttl_ms)s::integer, p_max_user_leases => %(max_user_leases)s::integer,
    p_require_none_awaiting => %(require_none_awaiting)s::boolean,
    p_require_awaiting_message_id => %(require_awaiting_message_id)s::bigint,
    p_roles => %(roles)s::text[], p_statuses => %(statuses)s::text[],
    p_blocks => %(blocks)s::text[], p_metadata => %(metadata)s::text[],
    p_cached_version => %(cached_version)s::bigint
) AS r
"""

# One batch of the online split of states stored whole (migration 11).
SPLIT_STATES: Final = """
SELECT split, skipped, last_user_id, last_session_id, last_state_key
FROM agentstate_split_states(%(batch)s::integer, %(user_id)s::text, %(session_id)s::bigint,
                             %(state_key)s::text)
"""

# States stored whole that a split would still turn into rows.
COUNT_UNSPLIT_STATES: Final = """
SELECT count(*) AS unsplit FROM t_agent_state
WHERE context_start IS NULL AND jsonb_typeof(payload -> 'context') = 'array'
"""

# -------------------------------------------------------------------- messages

# AppendMessage / UpdateMessage: the conversation's row lock, then the write.
WRITE_MESSAGE: Final = f"""
SELECT m.* FROM agentstate_touch_conversation(%(user_id)s, %(conversation_id)s) AS c,
LATERAL agentstate_write_messages(
    -- c's columns make the write run after (and only after) the lock.
    p_user_id => c.user_id, p_conversation_id => c.id,
    {_WRITES}
) AS m
"""

# No row: no such conversation. A row with a NULL id: no (more) messages.
LIST_MESSAGES: Final = f"""
SELECT m.*
FROM t_conversation AS c
LEFT JOIN LATERAL (
    SELECT {_MESSAGE_COLUMNS} FROM t_agent_message
    WHERE user_id = c.user_id AND conversation_id = c.id
      AND (%(after_id)s::bigint IS NULL OR id > %(after_id)s::bigint)
    ORDER BY id
    LIMIT %(limit)s
) AS m ON true
WHERE c.user_id = %(user_id)s AND c.id = %(conversation_id)s
ORDER BY m.id
"""

LIST_MESSAGES_NEWEST_FIRST: Final = f"""
SELECT m.*
FROM t_conversation AS c
LEFT JOIN LATERAL (
    SELECT {_MESSAGE_COLUMNS} FROM t_agent_message
    -- The parameters, not c's columns: the planner then estimates this conversation's
    -- own row count (a long one walks the index backwards to the limit, not a bitmap
    -- scan and sort of the whole conversation).
    WHERE user_id = %(user_id)s AND conversation_id = %(conversation_id)s
      AND (%(after_id)s::bigint IS NULL OR id < %(after_id)s::bigint)
    ORDER BY id DESC
    LIMIT %(limit)s
) AS m ON true
WHERE c.user_id = %(user_id)s AND c.id = %(conversation_id)s
ORDER BY m.id DESC
"""

SELECT_MESSAGE: Final = f"""
SELECT {_MESSAGE_COLUMNS}
FROM t_agent_message
WHERE user_id = %(user_id)s AND conversation_id = %(conversation_id)s AND id = %(message_id)s
"""

# ------------------------------------------------------------------ compactions

# No row: no such conversation. A row with a NULL id: no compactions.
LIST_COMPACTIONS: Final = """
SELECT k.id, k.messages_before, k.messages_after, k.tokens_before, k.tokens_after,
       k.summary_chars, k.reason, k.create_time
FROM t_conversation AS c
LEFT JOIN t_context_compaction AS k ON k.user_id = c.user_id AND k.conversation_id = c.id
WHERE c.user_id = %(user_id)s AND c.id = %(conversation_id)s
ORDER BY k.id
"""

# ---------------------------------------------------------------------- delete

DELETE_CONVERSATIONS: Final = """
SELECT conversations, messages, states
FROM agentstate_delete_conversations(%(user_id)s, %(conversation_ids)s::bigint[])
"""

# ---------------------------------------------------------------------- leases

_LEASE_COLUMNS = "task_id, conversation_id, user_id, holder, expire_time, stop_requested"

ACQUIRE_LEASE: Final = """
SELECT task_id, expire_time, stop_requested, lapsed_task_id
FROM agentstate_acquire_lease(%(user_id)s, %(conversation_id)s, %(holder)s,
                              %(ttl_ms)s::integer, %(max_user_leases)s::integer)
"""

# The conversation row anchors NOT_FOUND; the lease columns are NULL when none is held.
GET_LEASE: Final = """
SELECT l.task_id, c.id AS conversation_id, c.user_id, l.holder, l.expire_time,
       l.stop_requested, l.create_time
FROM t_conversation AS c
LEFT JOIN t_run_lease AS l ON l.conversation_id = c.id AND l.user_id = c.user_id
WHERE c.user_id = %(user_id)s AND c.id = %(conversation_id)s
"""

RENEW_LEASE: Final = f"""
UPDATE t_run_lease SET expire_time = now() + %(ttl_ms)s * interval '1 millisecond'
WHERE user_id = %(user_id)s AND task_id = %(task_id)s
RETURNING {_LEASE_COLUMNS}
"""

RELEASE_LEASE: Final = """
DELETE FROM t_run_lease WHERE user_id = %(user_id)s AND task_id = %(task_id)s
"""

REQUEST_STOP: Final = f"""
UPDATE t_run_lease SET stop_requested = true
WHERE user_id = %(user_id)s AND task_id = %(task_id)s AND expire_time > now()
RETURNING {_LEASE_COLUMNS}
"""

# ------------------------------------------------------------------- retention

# Conversations untouched since `before` and not running a turn; SKIP LOCKED lets
# several replicas sweep at once without waiting on each other. Runs inside an
# explicit transaction with DELETE_CONVERSATIONS for each user of the batch.
SELECT_INACTIVE_CONVERSATIONS: Final = """
SELECT c.id, c.user_id FROM t_conversation c
WHERE c.update_time < %(before)s
  AND NOT EXISTS (
      SELECT 1 FROM t_run_lease l
      WHERE l.user_id = c.user_id AND l.conversation_id = c.id AND l.expire_time > now()
  )
ORDER BY c.update_time
LIMIT %(limit)s
FOR UPDATE OF c SKIP LOCKED
"""

# ------------------------------------------------------ checkpoints (issue 15)

PUT_CHECKPOINT: Final = """
SELECT agentstate_put_checkpoint(
    %(user_id)s, %(conversation_id)s, %(namespace)s, %(checkpoint_id)s, %(parent_id)s,
    %(checkpoint_type)s, %(checkpoint)b, %(metadata)s, %(metadata_text)s::text,
    %(channel_versions)s,
    %(check_head)s, %(expected_head)s,
    %(channels)s::text[], %(versions)s::text[], %(value_types)s::text[], %(values)b::bytea[]
) AS create_time
"""

# A put with its parent's writes and the run lease (agentstate_put_checkpoint_step).
PUT_CHECKPOINT_STEP: Final = """
SELECT create_time, lease_task_id, lease_expire_time, lease_stop_requested
FROM agentstate_put_checkpoint_step(
    %(user_id)s, %(conversation_id)s, %(namespace)s, %(checkpoint_id)s, %(parent_id)s,
    %(checkpoint_type)s, %(checkpoint)b, %(metadata)s, %(metadata_text)s::text,
    %(channel_versions)s,
    %(check_head)s, %(expected_head)s,
    %(channels)s::text[], %(versions)s::text[], %(value_types)s::text[], %(values)b::bytea[],
    %(task_ids)s::text[], %(idxs)s::integer[], %(write_channels)s::text[],
    %(write_types)s::text[], %(write_values)b::bytea[], %(task_paths)s::text[],
    %(lease_holder)s::text, %(lease_task_id)s::bigint, %(lease_ttl_ms)s::integer,
    %(lease_release)s::boolean
)
"""

PUT_CHECKPOINT_WRITES: Final = """
SELECT agentstate_put_checkpoint_writes(
    %(user_id)s, %(conversation_id)s, %(namespace)s, %(checkpoint_id)s,
    %(task_ids)s::text[], %(idxs)s::integer[], %(channels)s::text[],
    %(value_types)s::text[], %(values)b::bytea[], %(task_paths)s::text[]
) AS stored
"""

DELETE_CHECKPOINTS_FOR_RUNS: Final = """
SELECT agentstate_delete_checkpoints_for_runs(%(user_id)s, %(run_ids)s::text[]) AS deleted
"""

COPY_CHECKPOINTS: Final = """
SELECT agentstate_copy_checkpoints(%(user_id)s, %(source)s, %(target)s) AS copied
"""

PRUNE_CHECKPOINTS: Final = """
SELECT agentstate_prune_checkpoints(%(user_id)s, %(ids)s::bigint[], %(keep_latest)s) AS deleted
"""

# Checkpoints with their channel values and pending writes, newest first, one
# statement. The conversation is the driving row: no row at all means it is
# absent (NOT_FOUND), one row with a NULL checkpoint_id means no checkpoint.
# Filters are optional (NULL: not applied). Run in binary format: bytea arrays
# cost a hex round trip in text (about 2 ms for 40 kB); JSON comes back as text.
SELECT_CHECKPOINTS: Final = """
SELECT conv.id AS conversation_id, c.namespace, c.checkpoint_id, c.parent_checkpoint_id,
       c.checkpoint_type, c.checkpoint,
       coalesce(c.metadata_text, c.metadata::text) AS metadata,
       c.channel_versions::text AS channel_versions, c.create_time,
       v.channels, v.versions, v.value_types, v.values,
       w.task_ids, w.idxs, w.write_channels, w.write_types, w.write_values, w.task_paths
FROM t_conversation AS conv
LEFT JOIN LATERAL (
    SELECT * FROM t_checkpoint AS c
    WHERE c.user_id = conv.user_id AND c.conversation_id = conv.id
      AND (%(namespace)s::text IS NULL OR c.namespace = %(namespace)s::text)
      AND (%(checkpoint_id)s::text IS NULL OR c.checkpoint_id = %(checkpoint_id)s::text)
      AND (%(before)s::text IS NULL OR c.checkpoint_id < %(before)s::text)
      AND (%(after_id)s::text IS NULL
           OR (c.checkpoint_id, c.namespace) < (%(after_id)s::text, %(after_ns)s::text))
      AND (%(filter)s::jsonb IS NULL OR c.metadata @> %(filter)s::jsonb)
    ORDER BY c.checkpoint_id DESC, c.namespace DESC
    LIMIT %(limit)s
) AS c ON true
LEFT JOIN LATERAL (
    SELECT array_agg(b.channel) AS channels, array_agg(b.version) AS versions,
           array_agg(b.value_type) AS value_types, array_agg(b.value) AS values
    FROM jsonb_each_text(c.channel_versions) AS cv
    JOIN t_checkpoint_blob AS b
      ON b.user_id = c.user_id AND b.conversation_id = c.conversation_id
     AND b.namespace = c.namespace AND b.channel = cv.key AND b.version = cv.value
) AS v ON c.checkpoint_id IS NOT NULL
LEFT JOIN LATERAL (
    SELECT array_agg(x.task_id ORDER BY x.task_path, x.task_id, x.idx) AS task_ids,
           array_agg(x.idx ORDER BY x.task_path, x.task_id, x.idx) AS idxs,
           array_agg(x.channel ORDER BY x.task_path, x.task_id, x.idx) AS write_channels,
           array_agg(x.value_type ORDER BY x.task_path, x.task_id, x.idx) AS write_types,
           array_agg(x.value ORDER BY x.task_path, x.task_id, x.idx) AS write_values,
           array_agg(x.task_path ORDER BY x.task_path, x.task_id, x.idx) AS task_paths
    FROM t_checkpoint_write AS x
    WHERE x.user_id = c.user_id AND x.conversation_id = c.conversation_id
      AND x.namespace = c.namespace AND x.checkpoint_id = c.checkpoint_id
) AS w ON c.checkpoint_id IS NOT NULL
WHERE conv.user_id = %(user_id)s AND conv.id = %(conversation_id)s
ORDER BY c.checkpoint_id DESC, c.namespace DESC
"""

# ------------------------------------------ conversation items, scoped state

_ITEM_COLUMNS = "seq, item, item_time, create_time"
# An item written before migration 12 has only its jsonb.
_ITEM_SOURCE_COLUMNS = "seq, coalesce(item_text, item::text) AS item, item_time, create_time"

APPEND_ITEMS: Final = """
SELECT seq, item, item_time, create_time, revision
FROM agentstate_append_items(%(user_id)s, %(conversation_id)s, %(items)s::text[],
                             %(item_times)s::timestamptz[], %(expected_revision)s::bigint)
"""

# A page of conversation c's items: the newest `last_n` of the selection (NULL: all),
# then a page of them oldest first.
_ITEM_PAGE: Final = f"""
    SELECT {_ITEM_COLUMNS} FROM (
        SELECT {_ITEM_SOURCE_COLUMNS} FROM t_conversation_item
        WHERE user_id = c.user_id AND conversation_id = c.id
          AND (%(min_item_time)s::timestamptz IS NULL
               OR item_time >= %(min_item_time)s::timestamptz)
        ORDER BY seq DESC
        LIMIT %(last_n)s::bigint
    ) AS newest
    WHERE %(after_seq)s::bigint IS NULL OR seq > %(after_seq)s::bigint
    ORDER BY seq
    LIMIT %(limit)s
"""

# No row: no such conversation. A row with a NULL seq: no (more) items.
LIST_ITEMS: Final = f"""
SELECT c.item_revision, c.update_time AS conversation_update_time, i.*
FROM t_conversation AS c
LEFT JOIN LATERAL ({_ITEM_PAGE}) AS i ON true
WHERE c.user_id = %(user_id)s AND c.id = %(conversation_id)s
ORDER BY i.seq
"""

# As LIST_ITEMS, with the conversation's state under a key and an app's scoped states
# in the same statement (one snapshot: an ADK session in one read). Item rows first
# (by seq), then at most one 'state', 'app' and 'user' row each. The state text is
# SELECT_STATE's, the scoped texts SELECT_SCOPED_STATE's (values sealed, as there).
LIST_ITEMS_WITH_STATES: Final = f"""
SELECT c.item_revision, c.update_time AS conversation_update_time, x.*
FROM t_conversation AS c
LEFT JOIN LATERAL (
    SELECT 'item' AS part, i.seq, i.item, i.item_time, i.create_time,
           NULL::text AS payload, NULL::bigint AS version, NULL::timestamptz AS update_time
    FROM ({_ITEM_PAGE}) AS i
    UNION ALL
    SELECT 'state', NULL, NULL, NULL, NULL, {_STATE_TEXT},
           s.version, s.update_time
    FROM t_agent_state AS s
    WHERE %(state_key)s <> '' AND s.user_id = c.user_id AND s.session_id = c.id
      AND s.state_key = %(state_key)s
    UNION ALL
    SELECT CASE WHEN g.user_id = '' THEN 'app' ELSE 'user' END, NULL, NULL, NULL, NULL,
           CASE WHEN g.member_keys IS NULL THEN g.payload::text
                ELSE agentstate_members_text(g.member_keys, g.member_values) END,
           g.version, g.update_time
    FROM t_scoped_state AS g
    WHERE %(scoped_app)s <> '' AND g.app_name = %(scoped_app)s
      AND g.user_id IN ('', c.user_id)
) AS x ON true
WHERE c.user_id = %(user_id)s AND c.id = %(conversation_id)s
ORDER BY x.part <> 'item', x.seq
"""

POP_ITEM: Final = """
SELECT seq, item, item_time, create_time, revision
FROM agentstate_pop_item(%(user_id)s, %(conversation_id)s, %(expected_revision)s::bigint)
"""

CLEAR_ITEMS: Final = """
SELECT deleted, revision FROM agentstate_clear_items(%(user_id)s, %(conversation_id)s)
"""

# user_id '' is the app-scoped row (a real user_id is never empty).
SELECT_SCOPED_STATE: Final = """
SELECT user_id,
       CASE WHEN member_keys IS NULL THEN payload::text
            ELSE agentstate_members_text(member_keys, member_values) END AS payload,
       version, update_time
FROM t_scoped_state
WHERE app_name = %(app_name)s AND user_id IN ('', %(user_id)s)
"""

APPEND_EVENT: Final = """
SELECT seq, item, item_time, create_time, revision, state_version
FROM agentstate_append_event(
    p_user_id => %(user_id)s, p_conversation_id => %(conversation_id)s,
    p_item => %(item)s::text, p_item_time => %(item_time)s::timestamptz,
    p_expected_revision => %(expected_revision)s::bigint, p_state_key => %(state_key)s,
    p_state_keys => %(state_keys)s::text[], p_state_values => %(state_values)s::text[],
    p_app_name => %(app_name)s,
    p_app_keys => %(app_keys)s::text[], p_app_values => %(app_values)s::text[],
    p_user_keys => %(user_keys)s::text[], p_user_values => %(user_values)s::text[]
)
"""
