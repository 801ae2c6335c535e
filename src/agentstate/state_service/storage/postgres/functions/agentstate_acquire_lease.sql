-- AcquireLease: the lease alone, in one statement.
CREATE OR REPLACE FUNCTION agentstate_acquire_lease(
    p_user_id text, p_conversation_id bigint, p_holder text, p_ttl_ms integer,
    p_max_user_leases integer,
    OUT task_id bigint, OUT expire_time timestamptz, OUT stop_requested boolean,
    OUT lapsed_task_id bigint)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM t_conversation
    WHERE user_id = p_user_id AND id = p_conversation_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'not_found', 'missing', 'conversation', 'conversation_id', p_conversation_id));
    END IF;
    SELECT * INTO task_id, expire_time, stop_requested, lapsed_task_id
    FROM agentstate_take_lease(p_user_id, p_conversation_id, p_holder, p_ttl_ms,
                               p_max_user_leases);
END $$;
