-- PopItem: one row; NULL item columns when the list was empty.
CREATE OR REPLACE FUNCTION agentstate_pop_item(p_user_id text, p_conversation_id bigint,
                                    p_expected_revision bigint)
RETURNS TABLE (seq bigint, item text, item_time timestamptz, create_time timestamptz,
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
        WHERE user_id = p_user_id AND id = p_conversation_id;
        v_revision := v_revision + 1;
    END IF;
    -- An item written before migration 12 has only its jsonb.
    RETURN QUERY SELECT v_item.seq, coalesce(v_item.item_text, v_item.item::text),
                        v_item.item_time, v_item.create_time, v_revision;
END $$;
