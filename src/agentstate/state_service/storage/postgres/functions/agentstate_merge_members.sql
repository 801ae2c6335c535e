-- A top-level merge over members (key spellings and value texts, see migration
-- 12), as Python's dict.update: a key already there keeps its place and takes the
-- new value, a new key goes at the end. p_old: a row written before migration 12
-- (jsonb), used when p_keys is NULL. The delta's keys are distinct (the service
-- sends the last of duplicate keys).
CREATE OR REPLACE FUNCTION agentstate_merge_members(
    p_keys text[], p_values text[], p_old jsonb, p_new_keys text[], p_new_values text[],
    OUT keys text[], OUT vals text[])
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    i integer;
    j integer;
BEGIN
    IF p_keys IS NULL AND p_old IS NOT NULL THEN
        SELECT coalesce(array_agg(to_jsonb(e.key)::text ORDER BY e.n), '{}'),
               coalesce(array_agg(e.value::text ORDER BY e.n), '{}')
        INTO keys, vals
        FROM jsonb_each(p_old) WITH ORDINALITY AS e(key, value, n);
    ELSE
        keys := coalesce(p_keys, '{}');
        vals := coalesce(p_values, '{}');
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_new_keys, 1), 0) LOOP
        j := array_position(keys, p_new_keys[i]);
        IF j IS NULL THEN
            keys := keys || p_new_keys[i];
            vals := vals || p_new_values[i];
        ELSE
            vals[j] := p_new_values[i];
        END IF;
    END LOOP;
END $$;
