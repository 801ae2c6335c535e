-- PutCheckpoint: lock the conversation row (NOT_FOUND when absent: no
-- resurrection), compare-and-set the namespace's head, store the new channel
-- values (a stored one is kept) and the checkpoint (a stored id is replaced).
-- p_metadata is the searchable copy, p_metadata_text the metadata as sent.
CREATE OR REPLACE FUNCTION agentstate_put_checkpoint(
    p_user_id text, p_conversation_id bigint, p_namespace text, p_checkpoint_id text,
    p_parent_id text, p_type text, p_checkpoint bytea, p_metadata jsonb,
    p_metadata_text text,
    p_channel_versions jsonb, p_check_head boolean, p_expected_head text,
    p_channels text[], p_versions text[], p_value_types text[], p_values bytea[])
RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    v_head text;
    v_time timestamptz;
BEGIN
    PERFORM agentstate_touch_conversation(p_user_id, p_conversation_id);
    IF p_check_head AND NOT EXISTS (
        SELECT 1 FROM t_checkpoint
        WHERE user_id = p_user_id AND conversation_id = p_conversation_id
          AND namespace = p_namespace AND checkpoint_id = p_checkpoint_id) THEN
        SELECT checkpoint_id INTO v_head FROM t_checkpoint
        WHERE user_id = p_user_id AND conversation_id = p_conversation_id
          AND namespace = p_namespace
        ORDER BY checkpoint_id DESC LIMIT 1;
        IF coalesce(v_head, '') <> p_expected_head THEN
            PERFORM agentstate_refuse(jsonb_build_object(
                'kind', 'checkpoint_conflict', 'namespace', p_namespace,
                'expected', p_expected_head, 'current', coalesce(v_head, '')));
        END IF;
    END IF;
    INSERT INTO t_checkpoint_blob
        (user_id, conversation_id, namespace, channel, version, value_type, value)
    SELECT p_user_id, p_conversation_id, p_namespace, b.channel, b.version, b.value_type, b.value
    FROM unnest(p_channels, p_versions, p_value_types, p_values)
        AS b(channel, version, value_type, value)
    ON CONFLICT DO NOTHING;
    INSERT INTO t_checkpoint AS c
        (user_id, conversation_id, namespace, checkpoint_id, parent_checkpoint_id,
         checkpoint_type, checkpoint, metadata, metadata_text, channel_versions)
    VALUES (p_user_id, p_conversation_id, p_namespace, p_checkpoint_id, p_parent_id,
            p_type, p_checkpoint, p_metadata, p_metadata_text, p_channel_versions)
    ON CONFLICT (user_id, conversation_id, namespace, checkpoint_id) DO UPDATE
    SET checkpoint_type = EXCLUDED.checkpoint_type, checkpoint = EXCLUDED.checkpoint,
        metadata = EXCLUDED.metadata, metadata_text = EXCLUDED.metadata_text,
        channel_versions = EXCLUDED.channel_versions
    RETURNING c.create_time INTO v_time;
    RETURN v_time;
END $$;
