-- The whole state's text from its rest and its context array's text.
CREATE OR REPLACE FUNCTION agentstate_state_text(p_rest jsonb, p_context text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT f.head || p_context || f.tail FROM agentstate_state_frame(p_rest) AS f
$$;
