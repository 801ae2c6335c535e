-- AppendEvent: the revision check, the item, the three deltas; one row. The item
-- is its text as sent; each delta is its members (key spellings, value texts),
-- merged at the top level (agentstate_merge_members) so the values it does not
-- name keep their text.
CREATE OR REPLACE FUNCTION agentstate_append_event(p_user_id text, p_conversation_id bigint,
    p_item text, p_item_time timestamptz, p_expected_revision bigint, p_state_key text,
    p_state_keys text[], p_state_values text[], p_app_name text,
    p_app_keys text[], p_app_values text[], p_user_keys text[], p_user_values text[])
RETURNS TABLE (seq bigint, item text, item_time timestamptz, create_time timestamptz,
               revision bigint, state_version bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_revision bigint;
    v_item t_conversation_item;
    v_state t_agent_state;
    v_merged record;
    v_state_version bigint;
BEGIN
    v_revision := agentstate_lock_items(p_user_id, p_conversation_id, p_expected_revision)
                  + 1;
    UPDATE t_conversation SET item_revision = v_revision
    WHERE user_id = p_user_id AND id = p_conversation_id;
    IF p_item IS NOT NULL THEN
        INSERT INTO t_conversation_item AS t
            (user_id, conversation_id, seq, item_text, item_time)
        VALUES (p_user_id, p_conversation_id, v_revision, p_item,
                coalesce(p_item_time, now()))
        RETURNING t.* INTO v_item;
    END IF;
    -- The conversation's row lock (taken above) serialises every writer of its states.
    SELECT * INTO v_state FROM t_agent_state AS s
    WHERE s.user_id = p_user_id AND s.session_id = p_conversation_id
      AND s.state_key = p_state_key;
    v_state_version := v_state.version;
    IF p_state_keys IS NOT NULL THEN
        IF v_state.version IS NULL THEN
            INSERT INTO t_agent_state (user_id, session_id, state_key, member_keys,
                                       member_values, version)
            VALUES (p_user_id, p_conversation_id, p_state_key, p_state_keys, p_state_values, 1);
            v_state_version := 1;
        ELSE
            IF v_state.context_start IS NOT NULL
               OR (v_state.member_keys IS NULL
                   AND jsonb_typeof(v_state.payload -> 'context') = 'array') THEN
                PERFORM agentstate_refuse(jsonb_build_object(
                    'kind', 'not_mergeable', 'state_key', p_state_key));
            END IF;
            v_merged := agentstate_merge_members(
                v_state.member_keys, v_state.member_values, v_state.payload, p_state_keys,
                p_state_values);
            UPDATE t_agent_state AS s
            SET payload = NULL, member_keys = v_merged.keys, member_values = v_merged.vals,
                version = s.version + 1, update_time = now()
            WHERE s.user_id = p_user_id AND s.session_id = p_conversation_id
              AND s.state_key = p_state_key
            RETURNING s.version INTO v_state_version;
        END IF;
    END IF;
    IF p_app_keys IS NOT NULL THEN
        PERFORM agentstate_merge_scoped_state(p_app_name, '', p_app_keys, p_app_values);
    END IF;
    IF p_user_keys IS NOT NULL THEN
        PERFORM agentstate_merge_scoped_state(p_app_name, p_user_id, p_user_keys, p_user_values);
    END IF;
    RETURN QUERY SELECT v_item.seq, v_item.item_text, v_item.item_time, v_item.create_time,
                        v_revision, coalesce(v_state_version, 0);
END $$;
