-- ClearItems.
CREATE OR REPLACE FUNCTION agentstate_clear_items(p_user_id text, p_conversation_id bigint,
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
