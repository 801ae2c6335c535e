CREATE OR REPLACE FUNCTION agentstate_copy_checkpoints(p_user_id text, p_source bigint, p_target bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_found bigint[];
    v_count bigint;
BEGIN
    SELECT coalesce(array_agg(id), '{}') INTO v_found FROM (
        SELECT id FROM t_conversation
        WHERE user_id = p_user_id AND id IN (p_source, p_target)
        ORDER BY id FOR NO KEY UPDATE) AS locked;
    IF NOT p_source = ANY(v_found) OR NOT p_target = ANY(v_found) THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'not_found', 'missing', 'conversation', 'conversation_id',
            CASE WHEN p_source = ANY(v_found) THEN p_target ELSE p_source END));
    END IF;
    IF EXISTS (SELECT 1 FROM t_checkpoint
               WHERE user_id = p_user_id AND conversation_id = p_target) THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'target_has_checkpoints', 'conversation_id', p_target));
    END IF;
    UPDATE t_conversation SET update_time = now() WHERE user_id = p_user_id AND id = p_target;
    INSERT INTO t_checkpoint_blob
        (user_id, conversation_id, namespace, channel, version, value_type, value)
    SELECT user_id, p_target, namespace, channel, version, value_type, value
    FROM t_checkpoint_blob WHERE user_id = p_user_id AND conversation_id = p_source;
    INSERT INTO t_checkpoint_write
        (user_id, conversation_id, namespace, checkpoint_id, task_id, idx, channel,
         value_type, value, task_path)
    SELECT user_id, p_target, namespace, checkpoint_id, task_id, idx, channel,
           value_type, value, task_path
    FROM t_checkpoint_write WHERE user_id = p_user_id AND conversation_id = p_source;
    INSERT INTO t_checkpoint
        (user_id, conversation_id, namespace, checkpoint_id, parent_checkpoint_id,
         checkpoint_type, checkpoint, metadata, metadata_text, channel_versions, create_time)
    SELECT user_id, p_target, namespace, checkpoint_id, parent_checkpoint_id,
           checkpoint_type, checkpoint, metadata, metadata_text, channel_versions, create_time
    FROM t_checkpoint WHERE user_id = p_user_id AND conversation_id = p_source;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END $$;
