CREATE OR REPLACE FUNCTION agentstate_delete_checkpoints_for_runs(p_user_id text, p_run_ids text[])
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[];
    v_count bigint;
BEGIN
    -- Lock the conversations concerned in id order (puts queue behind; no deadlock).
    SELECT coalesce(array_agg(id), '{}') INTO v_ids FROM (
        SELECT id FROM t_conversation
        WHERE user_id = p_user_id AND id IN (
            SELECT conversation_id FROM t_checkpoint
            WHERE user_id = p_user_id AND run_id = ANY(p_run_ids))
        ORDER BY id FOR NO KEY UPDATE) AS locked;
    DELETE FROM t_checkpoint
    WHERE user_id = p_user_id AND conversation_id = ANY(v_ids) AND run_id = ANY(p_run_ids);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    PERFORM agentstate_checkpoint_gc(p_user_id, v_ids);
    RETURN v_count;
END $$;
