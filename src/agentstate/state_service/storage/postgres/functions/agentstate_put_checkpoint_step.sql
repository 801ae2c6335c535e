-- PutCheckpoint with a graph step's pending writes for the parent checkpoint and
-- the run lease, in one transaction: the put (agentstate_put_checkpoint: row
-- lock, compare-and-set, values, checkpoint), the parent's writes (refused when
-- the parent is not stored: writes never outlive a refused put), then the
-- lease, as AcquireLease (no per-user limit), RenewLease and ReleaseLease treat
-- it. Any refusal undoes all of it.
CREATE OR REPLACE FUNCTION agentstate_put_checkpoint_step(
    p_user_id text, p_conversation_id bigint, p_namespace text, p_checkpoint_id text,
    p_parent_id text, p_type text, p_checkpoint bytea, p_metadata jsonb,
    p_metadata_text text,
    p_channel_versions jsonb, p_check_head boolean, p_expected_head text,
    p_channels text[], p_versions text[], p_value_types text[], p_values bytea[],
    p_task_ids text[], p_idxs integer[], p_write_channels text[], p_write_types text[],
    p_write_values bytea[], p_task_paths text[],
    p_lease_holder text, p_lease_task_id bigint, p_lease_ttl_ms integer,
    p_lease_release boolean,
    OUT create_time timestamptz, OUT lease_task_id bigint,
    OUT lease_expire_time timestamptz, OUT lease_stop_requested boolean)
LANGUAGE plpgsql AS $$
BEGIN
    create_time := agentstate_put_checkpoint(
        p_user_id, p_conversation_id, p_namespace, p_checkpoint_id, p_parent_id, p_type,
        p_checkpoint, p_metadata, p_metadata_text, p_channel_versions, p_check_head,
        p_expected_head, p_channels, p_versions, p_value_types, p_values);
    IF cardinality(p_task_ids) > 0 THEN
        -- The put holds the conversation's row lock, which a prune or a delete of
        -- checkpoints takes too: the parent cannot go before this commits.
        IF NOT EXISTS (
            SELECT 1 FROM t_checkpoint
            WHERE user_id = p_user_id AND conversation_id = p_conversation_id
              AND namespace = p_namespace AND checkpoint_id = p_parent_id) THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'checkpoint_not_stored', 'namespace', p_namespace,
                'checkpoint_id', coalesce(p_parent_id, '')));
        END IF;
        -- As agentstate_put_checkpoint_writes: a stored idx >= 0 is kept, idx < 0 replaced.
        INSERT INTO t_checkpoint_write AS w
            (user_id, conversation_id, namespace, checkpoint_id, task_id, idx, channel,
             value_type, value, task_path)
        SELECT p_user_id, p_conversation_id, p_namespace, p_parent_id, x.task_id, x.idx,
               x.channel, x.value_type, x.value, x.task_path
        FROM unnest(p_task_ids, p_idxs, p_write_channels, p_write_types, p_write_values,
                    p_task_paths) AS x(task_id, idx, channel, value_type, value, task_path)
        ON CONFLICT (user_id, conversation_id, namespace, checkpoint_id, task_id, idx) DO UPDATE
        SET channel = EXCLUDED.channel, value_type = EXCLUDED.value_type,
            value = EXCLUDED.value, task_path = EXCLUDED.task_path
        WHERE EXCLUDED.idx < 0;
    END IF;
    IF p_lease_task_id IS NULL AND p_lease_holder <> '' THEN
        -- The put above holds the conversation's row lock, as take_lease needs.
        SELECT l.task_id, l.expire_time, l.stop_requested
        INTO lease_task_id, lease_expire_time, lease_stop_requested
        FROM agentstate_take_lease(p_user_id, p_conversation_id, p_lease_holder,
                                   p_lease_ttl_ms, 0) AS l;
    ELSIF p_lease_task_id IS NOT NULL AND p_lease_ttl_ms > 0 THEN
        UPDATE t_run_lease AS l
        SET expire_time = now() + p_lease_ttl_ms * interval '1 millisecond'
        WHERE l.user_id = p_user_id AND l.task_id = p_lease_task_id
        RETURNING l.task_id, l.expire_time, l.stop_requested
        INTO lease_task_id, lease_expire_time, lease_stop_requested;
        IF NOT FOUND THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'lease_gone', 'task_id', p_lease_task_id));
        END IF;
    ELSE
        lease_task_id := p_lease_task_id;
    END IF;
    IF p_lease_release AND lease_task_id IS NOT NULL THEN
        DELETE FROM t_run_lease AS l
        WHERE l.user_id = p_user_id AND l.task_id = lease_task_id;
        lease_task_id := NULL;
        lease_expire_time := NULL;
        lease_stop_requested := NULL;
    END IF;
END $$;
