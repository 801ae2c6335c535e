-- Every refusal the functions below make is SQLSTATE AS000 with a JSON DETAIL
-- ({"kind": ..., ...}); the store turns it into the domain's error and message.
CREATE OR REPLACE FUNCTION agentstate_refuse(p_detail jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'AS000', MESSAGE = p_detail->>'kind', DETAIL = p_detail::text;
END $$;
