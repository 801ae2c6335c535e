"""Every SQL statement the PostgreSQL store runs, kept together and named.

Parameters are named (%(name)s). JSON columns are read and written as raw
bytes (see postgres.py): PostgreSQL parses and stores the JSONB; Python never
decodes a payload on this path.
"""

from typing import Final

# --------------------------------------------------------------- conversations

INSERT_CONVERSATION: Final = """
INSERT INTO t_conversation (user_id, title) VALUES (%(user_id)s, %(title)s)
RETURNING id, user_id, title, create_time, update_time
"""

SELECT_CONVERSATION: Final = """
SELECT id, user_id, title, create_time, update_time
FROM t_conversation WHERE user_id = %(user_id)s AND id = %(conversation_id)s
"""

LIST_CONVERSATIONS: Final = """
SELECT id, user_id, title, create_time, update_time
FROM t_conversation
WHERE user_id = %(user_id)s AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s
"""

RENAME_CONVERSATION: Final = """
UPDATE t_conversation SET title = %(title)s, update_time = now()
WHERE user_id = %(user_id)s AND id = %(conversation_id)s
RETURNING id, user_id, title, create_time, update_time
"""

# Marks activity and takes the conversation's row lock (FOR NO KEY UPDATE):
# writes to one conversation queue behind each other, and a concurrent delete
# (FOR UPDATE) either finishes first, so this finds no row, or waits for us.
TOUCH_CONVERSATION: Final = """
UPDATE t_conversation SET update_time = now()
WHERE user_id = %(user_id)s AND id = %(conversation_id)s
RETURNING id
"""

# ----------------------------------------------------------------------- state

SELECT_STATE: Final = """
SELECT payload, version, update_time
FROM t_agent_state
WHERE user_id = %(user_id)s AND session_id = %(conversation_id)s AND state_key = %(state_key)s
"""

SELECT_STATE_VERSION: Final = """
SELECT version
FROM t_agent_state
WHERE user_id = %(user_id)s AND session_id = %(conversation_id)s AND state_key = %(state_key)s
"""

# The source's whole-payload upsert, plus a version that counts writes.
UPSERT_STATE: Final = """
INSERT INTO t_agent_state (user_id, session_id, state_key, payload, version)
VALUES (%(user_id)s, %(conversation_id)s, %(state_key)s, %(payload)s, 1)
ON CONFLICT (user_id, session_id, state_key)
DO UPDATE SET payload = EXCLUDED.payload,
              version = t_agent_state.version + 1,
              update_time = now()
RETURNING version, update_time
"""

INSERT_STATE_IF_ABSENT: Final = """
INSERT INTO t_agent_state (user_id, session_id, state_key, payload, version)
VALUES (%(user_id)s, %(conversation_id)s, %(state_key)s, %(payload)s, 1)
ON CONFLICT (user_id, session_id, state_key) DO NOTHING
RETURNING version, update_time
"""

UPDATE_STATE_IF_VERSION: Final = """
UPDATE t_agent_state
SET payload = %(payload)s, version = version + 1, update_time = now()
WHERE user_id = %(user_id)s AND session_id = %(conversation_id)s
  AND state_key = %(state_key)s AND version = %(expected_version)s
RETURNING version, update_time
"""

# -------------------------------------------------------------------- messages

_MESSAGE_COLUMNS = (
    "id, conversation_id, user_id, role, blocks, status, metadata, create_time, update_time"
)

INSERT_MESSAGE: Final = f"""
INSERT INTO t_agent_message (user_id, conversation_id, role, blocks, status, metadata)
VALUES (%(user_id)s, %(conversation_id)s, %(role)s, %(blocks)s, %(status)s, %(metadata)s)
RETURNING {_MESSAGE_COLUMNS}
"""

UPDATE_MESSAGE: Final = f"""
UPDATE t_agent_message
SET status = COALESCE(%(status)s::text, status),
    blocks = COALESCE(%(blocks)s, blocks),
    metadata = COALESCE(%(metadata)s, metadata),
    update_time = now()
WHERE user_id = %(user_id)s AND conversation_id = %(conversation_id)s AND id = %(message_id)s
  AND (%(expected_status)s::text IS NULL OR status = %(expected_status)s::text)
RETURNING {_MESSAGE_COLUMNS}
"""

SELECT_MESSAGE_STATUS: Final = """
SELECT status FROM t_agent_message
WHERE user_id = %(user_id)s AND conversation_id = %(conversation_id)s AND id = %(message_id)s
"""

LIST_MESSAGES: Final = f"""
SELECT {_MESSAGE_COLUMNS}
FROM t_agent_message
WHERE user_id = %(user_id)s AND conversation_id = %(conversation_id)s
  AND (%(after_id)s::bigint IS NULL OR id > %(after_id)s::bigint)
ORDER BY id
LIMIT %(limit)s
"""

LIST_MESSAGES_NEWEST_FIRST: Final = f"""
SELECT {_MESSAGE_COLUMNS}
FROM t_agent_message
WHERE user_id = %(user_id)s AND conversation_id = %(conversation_id)s
  AND (%(after_id)s::bigint IS NULL OR id < %(after_id)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s
"""

# ------------------------------------------------------------------ compactions

_COMPACTION_COLUMNS = (
    "id, messages_before, messages_after, tokens_before, tokens_after, summary_chars, reason, "
    "create_time"
)

INSERT_COMPACTION: Final = f"""
INSERT INTO t_context_compaction (user_id, conversation_id, messages_before, messages_after,
                                  tokens_before, tokens_after, summary_chars, reason)
VALUES (%(user_id)s, %(conversation_id)s, %(messages_before)s, %(messages_after)s,
        %(tokens_before)s, %(tokens_after)s, %(summary_chars)s, %(reason)s)
RETURNING {_COMPACTION_COLUMNS}
"""

LIST_COMPACTIONS: Final = f"""
SELECT {_COMPACTION_COLUMNS} FROM t_context_compaction
WHERE user_id = %(user_id)s AND conversation_id = %(conversation_id)s
ORDER BY id
"""

# ---------------------------------------------------------------------- delete

# Lock every conversation of the batch first, in id order, so concurrent
# batches cannot deadlock and concurrent writers wait (see TOUCH_CONVERSATION).
LOCK_CONVERSATIONS_FOR_DELETE: Final = """
SELECT id FROM t_conversation
WHERE user_id = %(user_id)s AND id = ANY(%(conversation_ids)s)
ORDER BY id
FOR UPDATE
"""

DELETE_LEASES: Final = """
DELETE FROM t_run_lease WHERE user_id = %(user_id)s AND conversation_id = ANY(%(conversation_ids)s)
"""

DELETE_COMPACTIONS: Final = """
DELETE FROM t_context_compaction
WHERE user_id = %(user_id)s AND conversation_id = ANY(%(conversation_ids)s)
"""

DELETE_STATES: Final = """
DELETE FROM t_agent_state WHERE user_id = %(user_id)s AND session_id = ANY(%(conversation_ids)s)
"""

DELETE_MESSAGES: Final = """
DELETE FROM t_agent_message
WHERE user_id = %(user_id)s AND conversation_id = ANY(%(conversation_ids)s)
"""

DELETE_CONVERSATIONS: Final = """
DELETE FROM t_conversation WHERE user_id = %(user_id)s AND id = ANY(%(conversation_ids)s)
"""

SELECT_MESSAGE: Final = f"""
SELECT {_MESSAGE_COLUMNS}
FROM t_agent_message
WHERE user_id = %(user_id)s AND conversation_id = %(conversation_id)s AND id = %(message_id)s
"""

# ---------------------------------------------------------------------- leases

_LEASE_COLUMNS = "task_id, conversation_id, user_id, holder, expire_time, stop_requested"

# Serialises one user's lease acquisitions, so the per-user limit holds under races.
LOCK_USER_LEASES: Final = "SELECT pg_advisory_xact_lock(hashtextextended(%(user_id)s, 7))"

LOCK_CONVERSATION_SHARED: Final = """
SELECT id FROM t_conversation
WHERE user_id = %(user_id)s AND id = %(conversation_id)s
FOR KEY SHARE
"""

COUNT_OTHER_ACTIVE_LEASES: Final = """
SELECT count(*) FROM t_run_lease
WHERE user_id = %(user_id)s AND expire_time > now() AND conversation_id <> %(conversation_id)s
"""

# The lapsed lease this acquisition would replace, if any (a released lease is deleted,
# so a row that is still there belonged to a turn that never finished cleanly).
SELECT_LAPSED_LEASE: Final = """
SELECT task_id FROM t_run_lease
WHERE user_id = %(user_id)s AND conversation_id = %(conversation_id)s AND expire_time <= now()
FOR UPDATE
"""

# Takes the lease if there is none or the current one has lapsed.
ACQUIRE_LEASE: Final = f"""
INSERT INTO t_run_lease (conversation_id, user_id, task_id, holder, expire_time)
VALUES (%(conversation_id)s, %(user_id)s, agentstate_next_id(), %(holder)s,
        now() + %(ttl_ms)s * interval '1 millisecond')
ON CONFLICT (conversation_id) DO UPDATE
SET task_id = EXCLUDED.task_id, holder = EXCLUDED.holder, expire_time = EXCLUDED.expire_time,
    stop_requested = false, create_time = now()
WHERE t_run_lease.expire_time <= now()
RETURNING {_LEASE_COLUMNS}
"""

SELECT_LEASE_OF_CONVERSATION: Final = f"""
SELECT {_LEASE_COLUMNS} FROM t_run_lease
WHERE user_id = %(user_id)s AND conversation_id = %(conversation_id)s
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
# several replicas sweep at once without waiting on each other.
SELECT_INACTIVE_CONVERSATIONS: Final = """
SELECT c.id, c.user_id FROM t_conversation c
WHERE c.update_time < %(before)s
  AND NOT EXISTS (
      SELECT 1 FROM t_run_lease l WHERE l.conversation_id = c.id AND l.expire_time > now()
  )
ORDER BY c.update_time
LIMIT %(limit)s
FOR UPDATE OF c SKIP LOCKED
"""
