-- After checkpoints of these conversations were deleted: drop the writes and
-- channel values no remaining checkpoint has. The caller holds the row locks.
CREATE OR REPLACE FUNCTION agentstate_checkpoint_gc(p_user_id text, p_ids bigint[])
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM t_checkpoint_write AS w
    WHERE w.user_id = p_user_id AND w.conversation_id = ANY(p_ids)
      AND NOT EXISTS (
        SELECT 1 FROM t_checkpoint AS c
        WHERE c.user_id = w.user_id AND c.conversation_id = w.conversation_id
          AND c.namespace = w.namespace AND c.checkpoint_id = w.checkpoint_id);
    DELETE FROM t_checkpoint_blob AS b
    WHERE b.user_id = p_user_id AND b.conversation_id = ANY(p_ids)
      AND NOT EXISTS (
        SELECT 1 FROM t_checkpoint AS c
        WHERE c.user_id = b.user_id AND c.conversation_id = b.conversation_id
          AND c.namespace = b.namespace AND c.channel_versions ->> b.channel = b.version);
END $$;
