-- AppendItems: one row per item appended, in order. Each item is stored as the
-- text the caller sent (checked by the service: domain/jsontext.py).
CREATE OR REPLACE FUNCTION agentstate_append_items(p_user_id text, p_conversation_id bigint,
    p_items text[], p_item_times timestamptz[], p_expected_revision bigint)
RETURNS TABLE (seq bigint, item text, item_time timestamptz, create_time timestamptz,
               revision bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_revision bigint;
    n integer := coalesce(array_length(p_items, 1), 0);
BEGIN
    v_revision := agentstate_lock_items(p_user_id, p_conversation_id, p_expected_revision);
    UPDATE t_conversation SET item_revision = item_revision + n
    WHERE user_id = p_user_id AND id = p_conversation_id;
    RETURN QUERY
    INSERT INTO t_conversation_item AS t (user_id, conversation_id, seq, item_text, item_time)
    SELECT p_user_id, p_conversation_id, v_revision + i, p_items[i],
           coalesce(p_item_times[i], now())
    FROM generate_series(1, n) AS i
    ORDER BY i
    RETURNING t.seq, t.item_text, t.item_time, t.create_time, v_revision + n;
END $$;
