-- Lock a conversation row for a write and mark the activity. Writes to one
-- conversation queue behind each other; a delete (FOR UPDATE) either commits
-- first, and this finds no row (no resurrection), or waits for this one.
CREATE OR REPLACE FUNCTION agentstate_touch_conversation(p_user_id text, p_conversation_id bigint)
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
