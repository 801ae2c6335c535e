-- AppendEvent: the revision check, the item, the three deltas; one row.
CREATE OR REPLACE FUNCTION agentstate_append_event(p_user_id text, p_conversation_id bigint,
    p_item text, p_item_time timestamptz, p_expected_revision bigint, p_state_key text,
    p_state_delta jsonb, p_app_name text, p_app_delta jsonb, p_user_delta jsonb)
RETURNS TABLE (seq bigint, item jsonb, item_time timestamptz, create_time timestamptz,
               revision bigint, state_version bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_revision bigint;
    v_item t_conversation_item;
    v_state_version bigint;
BEGIN
    v_revision := agentstate_lock_items(p_user_id, p_conversation_id, p_expected_revision)
                  + 1;
    UPDATE t_conversation SET item_revision = v_revision
    WHERE user_id = p_user_id AND id = p_conversation_id;
    IF p_item IS NOT NULL THEN
        INSERT INTO t_conversation_item AS t (user_id, conversation_id, seq, item, item_time)
        VALUES (p_user_id, p_conversation_id, v_revision, p_item::jsonb,
                coalesce(p_item_time, now()))
        RETURNING t.* INTO v_item;
    END IF;
    IF p_state_delta IS NOT NULL THEN
        INSERT INTO t_agent_state AS s (user_id, session_id, state_key, payload, version)
        VALUES (p_user_id, p_conversation_id, p_state_key, p_state_delta, 1)
        ON CONFLICT (user_id, session_id, state_key) DO UPDATE
        SET payload = s.payload || EXCLUDED.payload, version = s.version + 1,
            update_time = now()
        RETURNING s.version INTO v_state_version;
    ELSE
        SELECT s.version INTO v_state_version FROM t_agent_state AS s
        WHERE s.user_id = p_user_id AND s.session_id = p_conversation_id
          AND s.state_key = p_state_key;
    END IF;
    IF p_app_delta IS NOT NULL THEN
        PERFORM agentstate_merge_scoped_state(p_app_name, '', p_app_delta);
    END IF;
    IF p_user_delta IS NOT NULL THEN
        PERFORM agentstate_merge_scoped_state(p_app_name, p_user_id, p_user_delta);
    END IF;
    RETURN QUERY SELECT v_item.seq, v_item.item, v_item.item_time, v_item.create_time,
                        v_revision, coalesce(v_state_version, 0);
END $$;
