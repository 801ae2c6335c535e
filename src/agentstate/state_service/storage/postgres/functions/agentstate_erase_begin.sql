-- EraseUser, step one: start an erasure of the user, or resume the one a crashed
-- call left running (its heartbeat older than p_stale_ms), and put up the fence.
-- `already_done`: the user has no rows and an earlier erasure finished (its id is
-- returned). Refuses 'erasure_running' when another call's erasure is alive, and
-- 'unknown_user' when the user has no rows and was never erased.
CREATE OR REPLACE FUNCTION agentstate_erase_begin(p_user_id text, p_user_hash text,
    p_stale_ms integer, OUT erasure_id bigint, OUT already_done boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_running t_erasure;
BEGIN
    already_done := false;
    -- Waits for the user's inserts in flight (agentstate_erasure_fence).
    PERFORM pg_advisory_xact_lock(1634956658, hashtext(p_user_id));
    SELECT * INTO v_running FROM t_erasure
    WHERE user_hash = p_user_hash AND NOT done FOR UPDATE;
    IF FOUND THEN
        IF v_running.heartbeat_time > now() - p_stale_ms * interval '1 millisecond' THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'erasure_running', 'erasure_id', v_running.id));
        END IF;
        UPDATE t_erasure SET heartbeat_time = now() WHERE id = v_running.id;
        erasure_id := v_running.id;
    ELSIF NOT EXISTS (SELECT 1 FROM t_conversation WHERE user_id = p_user_id)
          AND NOT EXISTS (SELECT 1 FROM t_scoped_state WHERE user_id = p_user_id) THEN
        SELECT max(id) INTO erasure_id FROM t_erasure WHERE user_hash = p_user_hash;
        IF erasure_id IS NULL THEN
            PERFORM agentstate_refuse(jsonb_build_object('kind', 'unknown_user'));
        END IF;
        already_done := true;
        RETURN;
    ELSE
        INSERT INTO t_erasure (user_hash) VALUES (p_user_hash) RETURNING id INTO erasure_id;
    END IF;
    INSERT INTO t_erasure_fence (user_id, erasure_id) VALUES (p_user_id, erasure_id)
    ON CONFLICT (user_id) DO UPDATE SET erasure_id = EXCLUDED.erasure_id;
    -- Running turns are asked to stop; their next write finds no conversation.
    UPDATE t_run_lease SET stop_requested = true WHERE user_id = p_user_id;
END $$;
