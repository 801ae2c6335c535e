-- An object's text from its members (as jsontext.object_text writes it).
CREATE OR REPLACE FUNCTION agentstate_members_text(p_keys text[], p_values text[])
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT '{' || coalesce(string_agg(u.k || ': ' || u.v, ', ' ORDER BY u.n), '') || '}'
    FROM unnest(p_keys, p_values) WITH ORDINALITY AS u(k, v, n)
$$;
