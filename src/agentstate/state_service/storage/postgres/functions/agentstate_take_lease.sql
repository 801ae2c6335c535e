-- Take a conversation's run lease. The caller holds the conversation's row lock.
CREATE OR REPLACE FUNCTION agentstate_take_lease(
    p_user_id text, p_conversation_id bigint, p_holder text, p_ttl_ms integer,
    p_max_user_leases integer,
    OUT task_id bigint, OUT expire_time timestamptz, OUT stop_requested boolean,
    OUT lapsed_task_id bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_running integer;
    v_held t_run_lease;
BEGIN
    -- Serialises one user's acquisitions, so the per-user limit holds under races.
    PERFORM pg_advisory_xact_lock(hashtextextended(p_user_id, 7));
    IF p_max_user_leases > 0 THEN
        SELECT count(*) INTO v_running FROM t_run_lease
        WHERE user_id = p_user_id AND expire_time > now() AND conversation_id <> p_conversation_id;
        IF v_running >= p_max_user_leases THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'user_lease_limit', 'running', v_running, 'limit', p_max_user_leases));
        END IF;
    END IF;
    SELECT * INTO v_held FROM t_run_lease
    WHERE user_id = p_user_id AND conversation_id = p_conversation_id FOR UPDATE;
    IF FOUND AND v_held.expire_time > now() THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'lease_held', 'conversation_id', p_conversation_id,
            'task_id', v_held.task_id, 'holder', v_held.holder,
            'expire_time', v_held.expire_time));
    END IF;
    -- A row still there lapsed without being released: its turn never finished.
    lapsed_task_id := v_held.task_id;
    INSERT INTO t_run_lease AS l (conversation_id, user_id, task_id, holder, expire_time)
    VALUES (p_conversation_id, p_user_id, agentstate_next_id(), p_holder,
            now() + p_ttl_ms * interval '1 millisecond')
    ON CONFLICT (user_id, conversation_id) DO UPDATE
    SET task_id = EXCLUDED.task_id, holder = EXCLUDED.holder,
        expire_time = EXCLUDED.expire_time, stop_requested = false, create_time = now()
    RETURNING l.task_id, l.expire_time, l.stop_requested
    INTO task_id, expire_time, stop_requested;
END $$;
