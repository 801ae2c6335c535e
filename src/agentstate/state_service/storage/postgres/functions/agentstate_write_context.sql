-- Write a context's messages from index p_from on (positions p_start + p_from
-- ...) and remove every row after them. Rows whose text is unchanged are left
-- alone, so a whole-state save writes only the messages that changed. The
-- caller holds the conversation's row lock. Returns the octet length of the
-- rows it removed or replaced (what the tail weighed before).
CREATE OR REPLACE FUNCTION agentstate_write_context(
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
        ON CONFLICT (user_id, session_id, state_key, position)
        DO UPDATE SET message = EXCLUDED.message WHERE m.message <> EXCLUDED.message;
    END IF;
    IF v_old > 0 THEN
        DELETE FROM t_agent_state_message
        WHERE user_id = p_user_id AND session_id = p_session_id AND state_key = p_state_key
          AND position >= p_start + p_from + n;
    END IF;
    RETURN v_old;
END $$;
