-- Write a context's messages from index p_from on (positions p_start + p_from
-- ...) and remove every row after them. Messages are kept in chunks (migration
-- 16): a row holds the messages from its position on, up to about 8 KB of text,
-- so a small state is one row and rows are large enough to be compressed. The
-- first chunk may begin before p_start (the context's start): a compaction
-- leaves the chunk it cuts as it is, and every read skips its messages before
-- the start. The chunk holding the last message kept is rewritten with the new
-- ones when the cut falls inside it or it has room, so appends fill it; a chunk
-- whose text is unchanged is left alone, so a whole-state save writes only the
-- chunks that changed. p_from 0 replaces every row of the state; p_from -1 does
-- too and counts nothing (a whole save, which has no use for the count: counting
-- reads every chunk). The caller holds the conversation's row lock. Returns the
-- octet length of the messages it removed or replaced (what the tail weighed
-- before), 0 for p_from -1.
CREATE OR REPLACE FUNCTION agentstate_write_context(
    p_user_id text, p_session_id bigint, p_state_key text, p_start bigint, p_from bigint,
    p_messages text[])
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_cut bigint := p_start + greatest(p_from, 0);
    v_base bigint := p_start + greatest(p_from, 0);
    v_all text[] := coalesce(p_messages, '{}');
    v_kept bigint := 0;
    v_old bigint;
    v_position bigint;
    v_chunk text[];
    v_inside boolean := false;
BEGIN
    IF p_from > 0 THEN
        SELECT m.position, m.messages INTO v_position, v_chunk FROM t_agent_state_message AS m
        WHERE m.user_id = p_user_id AND m.session_id = p_session_id
          AND m.state_key = p_state_key AND m.position < v_cut
        ORDER BY m.position DESC LIMIT 1;
        -- v_chunk is a variable: detoasted once for the checks and slices below.
        IF v_chunk IS NOT NULL AND (
               v_cut - v_position < cardinality(v_chunk)
               OR octet_length(array_to_string(v_chunk, '')) < 8192) THEN
            v_base := v_position;
            v_inside := v_cut - v_position < cardinality(v_chunk);
            v_chunk := v_chunk[1 : v_cut - v_position];
            v_all := v_chunk || v_all;
            -- What stays of it within the context (not before p_start).
            v_kept := agentstate_plain_length(array_to_string(
                v_chunk[greatest(p_start - v_position, 0) + 1 :], ''));
        END IF;
    END IF;
    IF p_from > 0 AND NOT v_inside AND cardinality(v_all) > 0
       AND octet_length(array_to_string(v_all[1 : cardinality(v_all) - 1], '')) < 8192
       AND NOT EXISTS (
           SELECT FROM t_agent_state_message AS m
           WHERE m.user_id = p_user_id AND m.session_id = p_session_id
             AND m.state_key = p_state_key AND m.position >= v_cut) THEN
        -- The common turn: messages appended, one chunk (the last one refilled, or a
        -- new one), nothing after it to compare, remove or count.
        IF v_base = v_position THEN
            UPDATE t_agent_state_message AS m SET messages = v_all
            WHERE m.user_id = p_user_id AND m.session_id = p_session_id
              AND m.state_key = p_state_key AND m.position = v_base;
        ELSE
            INSERT INTO t_agent_state_message (user_id, session_id, state_key, position, messages)
            VALUES (p_user_id, p_session_id, p_state_key, v_base, v_all);
        END IF;
        RETURN 0;
    END IF;
    -- The messages from v_base on (p_from 0: all of them) within the context.
    IF p_from >= 0 THEN
        SELECT coalesce(sum(coalesce(
                   agentstate_plain_length(m.message),
                   agentstate_plain_length(array_to_string(
                       m.messages[greatest(p_start - m.position, 0) + 1 :], '')))), 0) - v_kept
        INTO v_old FROM t_agent_state_message AS m
        WHERE m.user_id = p_user_id AND m.session_id = p_session_id AND m.state_key = p_state_key
          AND (p_from = 0 OR m.position >= v_base);
    END IF;
    -- Chunks from v_base on: a message joins the chunk its first byte falls in.
    WITH u AS (
        SELECT u.message, u.i, coalesce(sum(octet_length(u.message)) OVER (
                   ORDER BY u.i ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before
        FROM unnest(v_all) WITH ORDINALITY AS u(message, i)),
    chunks AS (
        SELECT v_base + min(u.i) - 1 AS position, array_agg(u.message ORDER BY u.i) AS messages
        FROM u GROUP BY u.before / 8192),
    gone AS (
        DELETE FROM t_agent_state_message AS m
        WHERE m.user_id = p_user_id AND m.session_id = p_session_id
          AND m.state_key = p_state_key AND (p_from <= 0 OR m.position >= v_base)
          AND m.position NOT IN (SELECT c.position FROM chunks AS c))
    INSERT INTO t_agent_state_message AS m (user_id, session_id, state_key, position, messages)
    SELECT p_user_id, p_session_id, p_state_key, c.position, c.messages FROM chunks AS c
    ON CONFLICT (user_id, session_id, state_key, position)
    DO UPDATE SET messages = EXCLUDED.messages, message = NULL
    WHERE m.messages IS DISTINCT FROM EXCLUDED.messages;
    RETURN coalesce(v_old, 0);
END $$;
