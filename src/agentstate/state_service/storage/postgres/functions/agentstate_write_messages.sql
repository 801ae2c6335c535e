-- Apply message record writes in order; return the rows written, in order.
-- p_kinds[i] is 'insert' (p_roles, p_statuses, p_blocks, p_metadata) or
-- 'update' (p_message_ids, and NULL in p_statuses / p_blocks / p_metadata
-- leaves that column as it is; p_expected_statuses makes it compare-and-set).
-- JSON arrives as text and is parsed here; a bad one fails the statement with
-- PostgreSQL's data error (the store then names the write, off the hot path).
CREATE OR REPLACE FUNCTION agentstate_write_messages(
    p_user_id text, p_conversation_id bigint, p_kinds text[], p_message_ids bigint[],
    p_roles text[], p_statuses text[], p_blocks text[], p_metadata text[],
    p_expected_statuses text[])
RETURNS SETOF t_agent_message
LANGUAGE plpgsql AS $$
DECLARE
    v_row t_agent_message;
    v_index integer := 0;
    v_status text;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_kinds, 1), 0) LOOP
        v_index := i - 1;
        IF p_kinds[i] = 'insert' THEN
            INSERT INTO t_agent_message (user_id, conversation_id, role, blocks, status, metadata)
            VALUES (p_user_id, p_conversation_id, p_roles[i], p_blocks[i]::jsonb, p_statuses[i],
                    p_metadata[i]::jsonb)
            RETURNING * INTO v_row;
        ELSE
            UPDATE t_agent_message
            SET status = coalesce(p_statuses[i], status),
                blocks = coalesce(p_blocks[i]::jsonb, blocks),
                metadata = coalesce(p_metadata[i]::jsonb, metadata),
                update_time = now()
            WHERE user_id = p_user_id AND conversation_id = p_conversation_id
              AND id = p_message_ids[i]
              AND (p_expected_statuses[i] IS NULL OR status = p_expected_statuses[i])
            RETURNING * INTO v_row;
            IF NOT FOUND THEN
                SELECT status INTO v_status FROM t_agent_message
                WHERE user_id = p_user_id AND conversation_id = p_conversation_id
                  AND id = p_message_ids[i];
                IF NOT FOUND THEN
                    PERFORM agentstate_refuse(jsonb_build_object(
                        'kind', 'not_found', 'missing', 'message', 'index', v_index,
                        'message_id', p_message_ids[i], 'conversation_id', p_conversation_id));
                END IF;
                PERFORM agentstate_refuse(jsonb_build_object(
                    'kind', 'status_mismatch', 'index', v_index, 'message_id', p_message_ids[i],
                    'status', v_status, 'expected', p_expected_statuses[i]));
            END IF;
        END IF;
        RETURN NEXT v_row;
    END LOOP;
END $$;
