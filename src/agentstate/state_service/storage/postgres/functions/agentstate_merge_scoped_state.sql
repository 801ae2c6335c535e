-- Merge a delta (its members: key spellings and value texts) into one scoped
-- state at the top level: the delta's keys win, every other value is kept as it
-- was sent (see agentstate_merge_members).
CREATE OR REPLACE FUNCTION agentstate_merge_scoped_state(
    p_app_name text, p_user_id text, p_keys text[], p_values text[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_row t_scoped_state;
    v_merged record;
BEGIN
    SELECT * INTO v_row FROM t_scoped_state
    WHERE app_name = p_app_name AND user_id = p_user_id FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO t_scoped_state AS s (app_name, user_id, member_keys, member_values, version)
        VALUES (p_app_name, p_user_id, p_keys, p_values, 1)
        ON CONFLICT (user_id, app_name) DO NOTHING;
        IF FOUND THEN
            RETURN;
        END IF;
        -- Another merge created the row meanwhile: merge into it.
        SELECT * INTO v_row FROM t_scoped_state
        WHERE app_name = p_app_name AND user_id = p_user_id FOR UPDATE;
    END IF;
    v_merged := agentstate_merge_members(
        v_row.member_keys, v_row.member_values, v_row.payload, p_keys, p_values);
    UPDATE t_scoped_state
    SET payload = NULL, member_keys = v_merged.keys, member_values = v_merged.vals,
        version = version + 1, update_time = now()
    WHERE app_name = p_app_name AND user_id = p_user_id;
END $$;
