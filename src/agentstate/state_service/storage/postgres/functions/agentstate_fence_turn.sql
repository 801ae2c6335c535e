-- EndTurn's fence, on its own so a rewrite of the save carries it as one call.
-- The caller has locked the conversation row (agentstate_touch_conversation),
-- so no lease can be granted between this check and the save.
CREATE OR REPLACE FUNCTION agentstate_fence_turn(p_user_id text, p_conversation_id bigint,
                                      p_task_id bigint)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_last bigint;
BEGIN
    SELECT last_task_id INTO v_last FROM t_conversation
    WHERE user_id = p_user_id AND id = p_conversation_id;
    IF v_last IS NOT NULL AND v_last <> p_task_id THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'lease_lost', 'task_id', p_task_id, 'holder_task_id', v_last));
    END IF;
END $$;
