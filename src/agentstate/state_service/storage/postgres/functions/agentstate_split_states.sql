-- Split up to p_batch states stored whole whose "context" is an array, after the
-- key (p_user_id, p_session_id, p_state_key) (NULLs: from the start), in key
-- order. Each call is one short transaction: it takes the conversation's row
-- lock as every writer does (NO KEY UPDATE, so the order is the writers' and a
-- delete waits for it or it skips), skipping rows someone holds, so it runs
-- beside live traffic. The state's version and JSON do not change. Returns how
-- many it split and the last key it looked at (NULL when it reached the end).
CREATE OR REPLACE FUNCTION agentstate_split_states(
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
