-- Merge a delta into one scoped state (top level: the delta's keys win).
CREATE OR REPLACE FUNCTION agentstate_merge_scoped_state(p_app_name text, p_user_id text, p_delta jsonb)
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO t_scoped_state AS s (app_name, user_id, payload, version)
    VALUES (p_app_name, p_user_id, p_delta, 1)
    ON CONFLICT (app_name, user_id) DO UPDATE
    SET payload = s.payload || EXCLUDED.payload, version = s.version + 1, update_time = now()
$$;
