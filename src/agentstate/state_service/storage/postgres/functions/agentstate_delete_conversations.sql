-- DeleteConversation / BatchDeleteConversations: lock every row in id order
-- (concurrent batches cannot deadlock; writers queue behind), all or nothing,
-- children first. Returns the counts.
CREATE OR REPLACE FUNCTION agentstate_delete_conversations(p_user_id text, p_ids bigint[],
    OUT conversations bigint, OUT messages bigint, OUT states bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_found bigint[];
    v_missing bigint;
BEGIN
    SELECT coalesce(array_agg(id), '{}') INTO v_found FROM (
        SELECT id FROM t_conversation
        WHERE user_id = p_user_id AND id = ANY(p_ids)
        ORDER BY id FOR UPDATE) AS locked;
    SELECT min(wanted) INTO v_missing FROM unnest(p_ids) AS wanted
    WHERE wanted <> ALL(v_found);
    IF v_missing IS NOT NULL THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'not_found', 'missing', 'conversation', 'conversation_id', v_missing,
            'nothing_deleted', true));
    END IF;
    DELETE FROM t_run_lease WHERE user_id = p_user_id AND conversation_id = ANY(v_found);
    DELETE FROM t_context_compaction WHERE user_id = p_user_id AND conversation_id = ANY(v_found);
    DELETE FROM t_agent_state WHERE user_id = p_user_id AND session_id = ANY(v_found);
    GET DIAGNOSTICS states = ROW_COUNT;
    DELETE FROM t_agent_message WHERE user_id = p_user_id AND conversation_id = ANY(v_found);
    GET DIAGNOSTICS messages = ROW_COUNT;
    DELETE FROM t_conversation WHERE user_id = p_user_id AND id = ANY(v_found);
    GET DIAGNOSTICS conversations = ROW_COUNT;
END $$;
