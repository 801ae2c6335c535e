-- The text around a state's context array, byte for byte what jsonb prints for
-- the unsplit state: the rest's members in jsonb's key order (shorter keys
-- first, then bytewise) with "context" where that order puts it.
CREATE OR REPLACE FUNCTION agentstate_state_frame(p_rest jsonb, OUT head text, OUT tail text)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT '{' || coalesce(string_agg(part, ', ' ORDER BY n) FILTER (WHERE before), '')
               || CASE WHEN bool_or(before) THEN ', ' ELSE '' END || '"context": ',
           coalesce(', ' || string_agg(part, ', ' ORDER BY n) FILTER (WHERE NOT before), '')
               || '}'
    FROM (
        SELECT e.n, to_jsonb(e.key)::text || ': ' || e.value::text AS part,
               octet_length(e.key) < 7
               OR (octet_length(e.key) = 7
                   AND convert_to(e.key, 'UTF8') < convert_to('context', 'UTF8')) AS before
        FROM jsonb_each(p_rest) WITH ORDINALITY AS e(key, value, n)
    ) AS parts
$$;
