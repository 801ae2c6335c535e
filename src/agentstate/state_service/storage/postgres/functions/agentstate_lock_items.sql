-- Lock the conversation (as every write does) and check the caller's revision.
-- Returns the current revision.
CREATE OR REPLACE FUNCTION agentstate_lock_items(p_user_id text, p_conversation_id bigint,
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
