-- EraseUser, one batch (one transaction): up to p_batch of the user's conversations
-- with everything they own, children first, each kind counted; the rows are locked in
-- id order, so a write to one of them either commits first (and is erased with it) or
-- waits and then finds no conversation. When none is left: the user's scoped state,
-- the receipt marked done, the fence taken down. `remaining` is false once done.
CREATE OR REPLACE FUNCTION agentstate_erase_batch(p_user_id text, p_erasure_id bigint,
    p_batch integer, OUT batch_counts jsonb, OUT remaining boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[];
    n bigint;
BEGIN
    batch_counts := '{}';
    SELECT coalesce(array_agg(id), '{}') INTO v_ids FROM (
        SELECT id FROM t_conversation WHERE user_id = p_user_id
        ORDER BY id LIMIT p_batch FOR UPDATE) AS locked;
    IF cardinality(v_ids) > 0 THEN
        DELETE FROM t_run_lease WHERE user_id = p_user_id AND conversation_id = ANY(v_ids);
        GET DIAGNOSTICS n = ROW_COUNT; batch_counts := batch_counts || jsonb_build_object('leases', n);
        DELETE FROM t_context_compaction
        WHERE user_id = p_user_id AND conversation_id = ANY(v_ids);
        GET DIAGNOSTICS n = ROW_COUNT; batch_counts := batch_counts || jsonb_build_object('compactions', n);
        -- Counted in messages: a row holds a chunk of them (migration 16).
        WITH gone AS (
            DELETE FROM t_agent_state_message
            WHERE user_id = p_user_id AND session_id = ANY(v_ids)
            RETURNING coalesce(cardinality(messages), 1) AS messages)
        SELECT coalesce(sum(messages), 0) INTO n FROM gone;
        batch_counts := batch_counts || jsonb_build_object('state_messages', n);
        DELETE FROM t_agent_state WHERE user_id = p_user_id AND session_id = ANY(v_ids);
        GET DIAGNOSTICS n = ROW_COUNT; batch_counts := batch_counts || jsonb_build_object('states', n);
        DELETE FROM t_agent_message WHERE user_id = p_user_id AND conversation_id = ANY(v_ids);
        GET DIAGNOSTICS n = ROW_COUNT; batch_counts := batch_counts || jsonb_build_object('messages', n);
        DELETE FROM t_conversation_item
        WHERE user_id = p_user_id AND conversation_id = ANY(v_ids);
        GET DIAGNOSTICS n = ROW_COUNT; batch_counts := batch_counts || jsonb_build_object('items', n);
        DELETE FROM t_checkpoint_write
        WHERE user_id = p_user_id AND conversation_id = ANY(v_ids);
        GET DIAGNOSTICS n = ROW_COUNT;
        batch_counts := batch_counts || jsonb_build_object('checkpoint_writes', n);
        DELETE FROM t_checkpoint_blob WHERE user_id = p_user_id AND conversation_id = ANY(v_ids);
        GET DIAGNOSTICS n = ROW_COUNT;
        batch_counts := batch_counts || jsonb_build_object('channel_values', n);
        DELETE FROM t_checkpoint WHERE user_id = p_user_id AND conversation_id = ANY(v_ids);
        GET DIAGNOSTICS n = ROW_COUNT; batch_counts := batch_counts || jsonb_build_object('checkpoints', n);
        DELETE FROM t_conversation WHERE user_id = p_user_id AND id = ANY(v_ids);
        GET DIAGNOSTICS n = ROW_COUNT;
        batch_counts := batch_counts || jsonb_build_object('conversations', n);
        remaining := true;
    ELSE
        DELETE FROM t_scoped_state WHERE user_id = p_user_id;
        GET DIAGNOSTICS n = ROW_COUNT;
        batch_counts := batch_counts || jsonb_build_object('scoped_states', n);
        -- The data key last (crypto-shredding, migration 14): sealed copies of
        -- anything above, in backups too, cannot be opened without it.
        DELETE FROM t_user_key WHERE user_id = p_user_id;
        DELETE FROM t_erasure_fence WHERE user_id = p_user_id;
        remaining := false;
    END IF;
    UPDATE t_erasure AS e SET
        counts = (SELECT jsonb_object_agg(k, coalesce((e.counts ->> k)::bigint, 0)
                                             + coalesce((batch_counts ->> k)::bigint, 0))
                  FROM (SELECT jsonb_object_keys(e.counts || batch_counts) AS k) AS keys),
        heartbeat_time = now(),
        done = NOT remaining,
        end_time = CASE WHEN remaining THEN NULL ELSE now() END
    WHERE e.id = p_erasure_id;
END $$;
