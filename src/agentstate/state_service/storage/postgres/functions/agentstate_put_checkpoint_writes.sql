-- PutCheckpointWrites: a key-share lock on the conversation row (writes of
-- several tasks do not queue behind each other; a delete does wait, and a
-- write after it is NOT_FOUND), a key-share lock on the checkpoint (a write
-- for a checkpoint that is not stored is refused: no put refused or lost ever
-- leaves writes behind; a prune of it waits), then insert; idx < 0 replaces.
CREATE OR REPLACE FUNCTION agentstate_put_checkpoint_writes(
    p_user_id text, p_conversation_id bigint, p_namespace text, p_checkpoint_id text,
    p_task_ids text[], p_idxs integer[], p_channels text[], p_value_types text[],
    p_values bytea[], p_task_paths text[])
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
BEGIN
    PERFORM 1 FROM t_conversation
    WHERE user_id = p_user_id AND id = p_conversation_id FOR KEY SHARE;
    IF NOT FOUND THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'not_found', 'missing', 'conversation', 'conversation_id', p_conversation_id));
    END IF;
    PERFORM 1 FROM t_checkpoint
    WHERE user_id = p_user_id AND conversation_id = p_conversation_id
      AND namespace = p_namespace AND checkpoint_id = p_checkpoint_id FOR KEY SHARE;
    IF NOT FOUND THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'checkpoint_not_stored', 'namespace', p_namespace,
            'checkpoint_id', p_checkpoint_id));
    END IF;
    INSERT INTO t_checkpoint_write AS w
        (user_id, conversation_id, namespace, checkpoint_id, task_id, idx, channel,
         value_type, value, task_path)
    SELECT p_user_id, p_conversation_id, p_namespace, p_checkpoint_id, x.task_id, x.idx,
           x.channel, x.value_type, x.value, x.task_path
    FROM unnest(p_task_ids, p_idxs, p_channels, p_value_types, p_values, p_task_paths)
        AS x(task_id, idx, channel, value_type, value, task_path)
    ON CONFLICT (user_id, conversation_id, namespace, checkpoint_id, task_id, idx) DO UPDATE
    SET channel = EXCLUDED.channel, value_type = EXCLUDED.value_type,
        value = EXCLUDED.value, task_path = EXCLUDED.task_path
    WHERE EXCLUDED.idx < 0;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END $$;
