CREATE OR REPLACE FUNCTION agentstate_save_state(
    p_user_id text, p_conversation_id bigint, p_state_key text,
    p_keys text[], p_values text[], p_head text, p_tail text, p_context text[],
    p_expected_version bigint, p_task_id bigint,
    p_kinds text[], p_message_ids bigint[], p_roles text[], p_statuses text[],
    p_blocks text[], p_metadata text[], p_expected_statuses text[],
    p_compactions bigint[], p_compaction_reasons text[],
    p_base_version bigint DEFAULT NULL, p_drop_head integer DEFAULT 0,
    p_replace_from integer DEFAULT NULL, p_messages text[] DEFAULT NULL,
    p_fields_head text DEFAULT NULL, p_fields_tail text DEFAULT NULL,
    p_max_bytes bigint DEFAULT NULL)
RETURNS TABLE (version bigint, state_update_time timestamptz, lease_released boolean,
               message t_agent_message)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_state t_agent_state;
    v_current bigint;
    v_released boolean := false;
    v_row t_agent_message;
    v_written integer := 0;
    v_rest jsonb;
    v_keys text[];
    v_values text[];
    v_start bigint;
    v_count integer;
    v_bytes bigint;
    v_new text[];
    v_new_bytes bigint;
    v_size bigint;
    v_from integer;
    v_head text;
    v_tail text;
    v_last_task bigint;
BEGIN
    -- As agentstate_touch_conversation and agentstate_fence_turn, written out (a
    -- function call costs more than these statements on a small state).
    UPDATE t_conversation AS c SET update_time = now()
    WHERE c.user_id = p_user_id AND c.id = p_conversation_id
    RETURNING c.last_task_id INTO v_last_task;
    IF NOT FOUND THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'not_found', 'missing', 'conversation', 'conversation_id', p_conversation_id));
    END IF;
    -- Fencing (migration 6): a turn whose lease another task took over never
    -- writes again, whether or not the lease is free now. The row lock above means
    -- no lease is granted between this check and the save.
    IF p_task_id IS NOT NULL AND v_last_task IS NOT NULL AND v_last_task <> p_task_id THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'lease_lost', 'task_id', p_task_id, 'holder_task_id', v_last_task));
    END IF;
    -- FOR UPDATE: the batched split (agentstate_split_states) may hold it.
    SELECT * INTO v_state FROM t_agent_state AS s
    WHERE s.user_id = p_user_id AND s.session_id = p_conversation_id
      AND s.state_key = p_state_key
    FOR UPDATE;
    v_current := coalesce(v_state.version, 0);
    IF (p_base_version IS NOT NULL AND p_base_version <> v_current)
       OR (p_base_version IS NULL AND p_expected_version IS NOT NULL
           AND p_expected_version <> v_current) THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'version_conflict', 'expected', coalesce(p_base_version, p_expected_version),
            'current', v_current));
    END IF;
    IF p_base_version IS NULL THEN
        -- A whole state, in its stored form (domain StateForm, made by the service
        -- from the text sent): split (p_context, positions kept, unchanged rows not
        -- rewritten) or its members.
        v_start := coalesce(v_state.context_start, 0);
        v_rest := NULL;
        IF p_context IS NOT NULL THEN
            PERFORM agentstate_write_context(
                p_user_id, p_conversation_id, p_state_key, v_start, -1, p_context);
            v_head := p_head;
            v_tail := p_tail;
            v_count := cardinality(p_context);
            SELECT coalesce(sum(agentstate_plain_length(m)), 0) INTO v_bytes FROM unnest(p_context) AS m;
        ELSE
            IF v_state.context_start IS NOT NULL THEN
                DELETE FROM t_agent_state_message AS m
                WHERE m.user_id = p_user_id AND m.session_id = p_conversation_id
                  AND m.state_key = p_state_key;
            END IF;
            v_keys := p_keys;
            v_values := p_values;
            v_start := NULL;
        END IF;
    ELSE
        -- A delta on the stored version (see StateDelta).
        IF v_state.context_start IS NULL AND v_state.member_keys IS NOT NULL THEN
            -- Stored as members: "context" absent is an empty one, placed last.
            IF '"context"' = ANY(v_state.member_keys) THEN
                PERFORM agentstate_refuse(jsonb_build_object('kind', 'context_not_array'));
            END IF;
            SELECT '{' || coalesce((
                       SELECT string_agg(u.k || ': ' || u.v || ', ', '' ORDER BY u.n)
                       FROM unnest(v_state.member_keys, v_state.member_values)
                           WITH ORDINALITY AS u(k, v, n)), '') || '"context": ',
                   '}', 0, 0, 0
            INTO v_state.context_head, v_state.context_tail, v_state.context_start,
                 v_state.context_count, v_state.context_bytes;
        ELSIF v_state.context_start IS NULL THEN
            -- Stored whole as jsonb, before migration 12.
            v_state := agentstate_split_state(v_state, true);
            IF v_state.context_start IS NULL THEN
                PERFORM agentstate_refuse(jsonb_build_object('kind', 'context_not_array'));
            END IF;
        END IF;
        v_start := v_state.context_start;
        v_count := v_state.context_count;
        v_bytes := v_state.context_bytes;
        v_rest := v_state.payload;
        v_head := v_state.context_head;
        v_tail := v_state.context_tail;
        IF p_drop_head > v_count THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'delta_range', 'field', 'drop_head', 'value', p_drop_head,
                'length', v_count));
        END IF;
        IF p_drop_head > 0 THEN
            -- Chunks wholly before the new start go; the one across it stays as it is
            -- (reads skip its messages before context_start) until it goes too.
            WITH dropped AS (
                DELETE FROM t_agent_state_message AS m
                WHERE m.user_id = p_user_id AND m.session_id = p_conversation_id
                  AND m.state_key = p_state_key AND m.position < v_start + p_drop_head
                  AND m.position + coalesce(cardinality(m.messages), 1)
                      <= v_start + p_drop_head
                RETURNING coalesce(agentstate_plain_length(m.message), agentstate_plain_length(array_to_string(
                    m.messages[greatest(v_start - m.position, 0) + 1 :], ''))) AS size)
            SELECT v_bytes - coalesce(sum(size), 0) INTO v_bytes FROM dropped;
            SELECT v_bytes - coalesce(sum(agentstate_plain_length(array_to_string(
                       m.messages[greatest(v_start - m.position, 0) + 1
                                  : v_start + p_drop_head - m.position], ''))), 0)
            INTO v_bytes FROM t_agent_state_message AS m
            WHERE m.user_id = p_user_id AND m.session_id = p_conversation_id
              AND m.state_key = p_state_key AND m.position < v_start + p_drop_head;
            v_start := v_start + p_drop_head;
            v_count := v_count - p_drop_head;
        END IF;
        v_from := coalesce(p_replace_from, v_count);
        IF v_from > v_count THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'delta_range', 'field', 'replace_from', 'value', v_from,
                'length', v_count));
        END IF;
        -- Each message checked by the service and kept as sent.
        v_new := coalesce(p_messages, '{}');
        SELECT coalesce(sum(agentstate_plain_length(m)), 0) INTO v_new_bytes FROM unnest(v_new) AS m;
        IF v_from < v_count OR cardinality(v_new) > 0 THEN
            v_bytes := v_bytes - agentstate_write_context(
                p_user_id, p_conversation_id, p_state_key, v_start, v_from, v_new) + v_new_bytes;
        END IF;
        v_count := v_from + cardinality(v_new);
        IF p_fields_head IS NOT NULL THEN
            -- The frame the service made from fields_json (its members, then "context").
            v_rest := NULL;
            v_head := p_fields_head;
            v_tail := p_fields_tail;
        END IF;
        IF p_max_bytes IS NOT NULL THEN
            -- The size of the whole state as GetState returns it.
            v_size := agentstate_plain_length(v_head) + agentstate_plain_length(v_tail)
                      + CASE WHEN v_count = 0 THEN 2 ELSE v_bytes + 2 * v_count END;
            IF v_size > p_max_bytes THEN
                PERFORM agentstate_refuse(jsonb_build_object(
                    'kind', 'too_large', 'size', v_size, 'limit', p_max_bytes));
            END IF;
        END IF;
    END IF;
    IF v_state.version IS NULL THEN
        INSERT INTO t_agent_state AS s (user_id, session_id, state_key, payload, version,
                                        member_keys, member_values,
                                        context_start, context_count, context_bytes,
                                        context_head, context_tail)
        VALUES (p_user_id, p_conversation_id, p_state_key, v_rest, 1, v_keys, v_values,
                v_start,
                CASE WHEN v_start IS NULL THEN NULL ELSE v_count END,
                CASE WHEN v_start IS NULL THEN NULL ELSE v_bytes END,
                CASE WHEN v_start IS NULL THEN NULL ELSE v_head END,
                CASE WHEN v_start IS NULL THEN NULL ELSE v_tail END)
        RETURNING s.* INTO v_state;
    ELSE
        UPDATE t_agent_state AS s
        SET payload = v_rest, version = s.version + 1, update_time = now(),
            member_keys = v_keys, member_values = v_values,
            context_start = v_start,
            context_count = CASE WHEN v_start IS NULL THEN NULL ELSE v_count END,
            context_bytes = CASE WHEN v_start IS NULL THEN NULL ELSE v_bytes END,
            context_head = CASE WHEN v_start IS NULL THEN NULL ELSE v_head END,
            context_tail = CASE WHEN v_start IS NULL THEN NULL ELSE v_tail END
        WHERE s.user_id = p_user_id AND s.session_id = p_conversation_id
          AND s.state_key = p_state_key
        RETURNING s.* INTO v_state;
    END IF;
    -- Compactions: five numbers each, flattened (see sql.py), and a reason.
    IF cardinality(p_compaction_reasons) > 0 THEN
        INSERT INTO t_context_compaction (user_id, conversation_id, messages_before, messages_after,
                                          tokens_before, tokens_after, summary_chars, reason)
        SELECT p_user_id, p_conversation_id, p_compactions[i * 5 + 1], p_compactions[i * 5 + 2],
               p_compactions[i * 5 + 3], p_compactions[i * 5 + 4], p_compactions[i * 5 + 5],
               p_compaction_reasons[i + 1]
        FROM generate_series(0, coalesce(array_length(p_compaction_reasons, 1), 0) - 1) AS i
        ORDER BY i;
    END IF;
    IF p_task_id IS NOT NULL THEN
        DELETE FROM t_run_lease
        WHERE user_id = p_user_id AND conversation_id = p_conversation_id AND task_id = p_task_id;
        v_released := FOUND;
    END IF;
    IF cardinality(p_kinds) > 0 THEN
        FOR v_row IN
            SELECT * FROM agentstate_write_messages(
                p_user_id, p_conversation_id, p_kinds, p_message_ids, p_roles, p_statuses, p_blocks,
                p_metadata, p_expected_statuses)
        LOOP
            v_written := v_written + 1;
            RETURN QUERY SELECT v_state.version, v_state.update_time, v_released, v_row;
        END LOOP;
    END IF;
    IF v_written = 0 THEN
        RETURN QUERY SELECT v_state.version, v_state.update_time, v_released,
                            NULL::t_agent_message;
    END IF;
END $$;
