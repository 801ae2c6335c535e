CREATE OR REPLACE FUNCTION agentstate_begin_turn(
    p_user_id text, p_conversation_id bigint, p_title text, p_state_key text,
    p_holder text, p_ttl_ms integer, p_max_user_leases integer,
    p_require_none_awaiting boolean, p_require_awaiting_message_id bigint,
    p_roles text[], p_statuses text[], p_blocks text[], p_metadata text[],
    p_cached_version bigint DEFAULT NULL)
RETURNS TABLE (conversation t_conversation, conversation_created boolean,
               task_id bigint, expire_time timestamptz, stop_requested boolean,
               lapsed_task_id bigint, interrupted_records integer,
               payload text, version bigint, state_update_time timestamptz,
               message_ids bigint[], message_time timestamptz, payload_omitted boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_conversation t_conversation;
    v_created boolean := p_conversation_id IS NULL;
    v_lease record;
    v_awaiting bigint;
    v_status text;
    v_interrupted integer;
    v_ids bigint[];
    n integer := coalesce(array_length(p_roles, 1), 0);
BEGIN
    IF v_created THEN
        INSERT INTO t_conversation (user_id, title) VALUES (p_user_id, p_title)
        RETURNING * INTO v_conversation;
    ELSE
        v_conversation := agentstate_touch_conversation(p_user_id, p_conversation_id);
    END IF;
    SELECT * INTO v_lease FROM agentstate_take_lease(
        p_user_id, v_conversation.id, p_holder, p_ttl_ms, p_max_user_leases);
    IF p_require_none_awaiting THEN
        SELECT id INTO v_awaiting FROM t_agent_message
        WHERE user_id = p_user_id AND conversation_id = v_conversation.id
          AND status = 'AWAITING_CONFIRM'
        ORDER BY id LIMIT 1;
        IF FOUND THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'card_pending', 'message_id', v_awaiting));
        END IF;
    ELSIF p_require_awaiting_message_id IS NOT NULL THEN
        SELECT status INTO v_status FROM t_agent_message
        WHERE user_id = p_user_id AND conversation_id = v_conversation.id
          AND id = p_require_awaiting_message_id;
        IF NOT FOUND THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'not_found', 'missing', 'message',
                'message_id', p_require_awaiting_message_id,
                'conversation_id', v_conversation.id));
        ELSIF v_status <> 'AWAITING_CONFIRM' THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'not_awaiting', 'message_id', p_require_awaiting_message_id,
                'status', v_status));
        END IF;
    END IF;
    -- Holding the lease means no turn runs: a record still STREAMING is a dead turn's.
    UPDATE t_agent_message SET status = 'INTERRUPTED', update_time = now()
    WHERE user_id = p_user_id AND conversation_id = v_conversation.id AND status = 'STREAMING';
    GET DIAGNOSTICS v_interrupted = ROW_COUNT;
    -- The new records, as agentstate_write_messages inserts them, in one statement: the
    -- ids are drawn first, in order, so the result follows the request.
    v_ids := ARRAY(SELECT agentstate_next_id() FROM generate_series(1, n));
    IF n > 0 THEN
        INSERT INTO t_agent_message (id, user_id, conversation_id, role, blocks, status, metadata)
        SELECT v_ids[u.i], p_user_id, v_conversation.id, u.role, u.blocks::jsonb, u.status,
               u.metadata::jsonb
        FROM unnest(p_roles, p_statuses, p_blocks, p_metadata)
            WITH ORDINALITY AS u(role, status, blocks, metadata, i);
    END IF;
    RETURN QUERY
    SELECT v_conversation, v_created, v_lease.task_id, v_lease.expire_time,
           v_lease.stop_requested, v_lease.lapsed_task_id, v_interrupted,
           -- As sql.SELECT_STATE: written out, not a function, so it is planned once.
           CASE WHEN s.version = p_cached_version THEN NULL
                WHEN s.member_keys IS NOT NULL
                    THEN agentstate_members_text(s.member_keys, s.member_values)
                WHEN s.context_start IS NULL THEN s.payload::text
                ELSE s.context_head || (
                    SELECT coalesce(
                        '[' || string_agg(
                        -- A first chunk may begin before the context (a compaction cut it).
                        coalesce(m.message, array_to_string(CASE WHEN m.position >= s.context_start
                            THEN m.messages ELSE m.messages[s.context_start - m.position + 1 :] END,
                            ', ')), ', '
                        ORDER BY m.position) || ']', '[]')
                    FROM t_agent_state_message AS m
                    WHERE m.session_id = s.session_id AND m.state_key = s.state_key
                      AND m.user_id = s.user_id) || s.context_tail END,
           s.version, s.update_time, coalesce(v_ids, '{}'), now(),
           coalesce(s.version = p_cached_version, false)
    FROM (SELECT 1) AS one
    LEFT JOIN t_agent_state AS s
      ON s.user_id = p_user_id AND s.session_id = v_conversation.id
     AND s.state_key = p_state_key;
END $$;
