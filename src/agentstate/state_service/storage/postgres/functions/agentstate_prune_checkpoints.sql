CREATE OR REPLACE FUNCTION agentstate_prune_checkpoints(p_user_id text, p_ids bigint[], p_keep_latest boolean)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_found bigint[];
    v_missing bigint;
    v_count bigint;
BEGIN
    SELECT coalesce(array_agg(id), '{}') INTO v_found FROM (
        SELECT id FROM t_conversation
        WHERE user_id = p_user_id AND id = ANY(p_ids)
        ORDER BY id FOR NO KEY UPDATE) AS locked;
    SELECT min(wanted) INTO v_missing FROM unnest(p_ids) AS wanted
    WHERE wanted <> ALL(v_found);
    IF v_missing IS NOT NULL THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'not_found', 'missing', 'conversation', 'conversation_id', v_missing,
            'nothing_pruned', true));
    END IF;
    DELETE FROM t_checkpoint AS c
    WHERE c.user_id = p_user_id AND c.conversation_id = ANY(v_found)
      AND (NOT p_keep_latest OR c.checkpoint_id < (
        SELECT max(h.checkpoint_id) FROM t_checkpoint AS h
        WHERE h.user_id = c.user_id AND h.conversation_id = c.conversation_id
          AND h.namespace = c.namespace));
    GET DIAGNOSTICS v_count = ROW_COUNT;
    PERFORM agentstate_checkpoint_gc(p_user_id, v_found);
    RETURN v_count;
END $$;
