-- Split a state stored whole into rows (the caller holds the conversation's row
-- lock and the state row's). The version does not change: the state is the
-- same. Returns the row after the split, or the row unchanged when its
-- "context" is absent (an empty context, when p_absent_is_empty) or not an array.
CREATE OR REPLACE FUNCTION agentstate_split_state(s t_agent_state, p_absent_is_empty boolean)
RETURNS t_agent_state
LANGUAGE plpgsql AS $$
DECLARE
    v_context jsonb := s.payload->'context';
    v_messages text[];
BEGIN
    IF s.context_start IS NOT NULL THEN
        RETURN s;
    END IF;
    IF v_context IS NULL AND p_absent_is_empty THEN
        v_context := '[]';
    ELSIF jsonb_typeof(v_context) IS DISTINCT FROM 'array' THEN
        RETURN s;
    END IF;
    SELECT coalesce(array_agg(e.value::text ORDER BY e.i), '{}') INTO v_messages
    FROM jsonb_array_elements(v_context) WITH ORDINALITY AS e(value, i);
    PERFORM agentstate_write_context(s.user_id, s.session_id, s.state_key, 0, -1, v_messages);
    UPDATE t_agent_state AS t
    SET payload = t.payload - 'context', context_start = 0,
        context_count = cardinality(v_messages),
        context_bytes = (SELECT coalesce(sum(octet_length(m)), 0) FROM unnest(v_messages) AS m),
        (context_head, context_tail) = (
            SELECT f.head, f.tail FROM agentstate_state_frame(t.payload - 'context') AS f)
    WHERE t.user_id = s.user_id AND t.session_id = s.session_id AND t.state_key = s.state_key
    RETURNING * INTO s;
    RETURN s;
END $$;
