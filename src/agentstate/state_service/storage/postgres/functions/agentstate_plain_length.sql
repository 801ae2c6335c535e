-- The octet length of a stored payload text as its plaintext (migration 14). A sealed
-- text is a token: U+0001, then padded base64 of an 8-byte key id, a 12-byte nonce and
-- the ciphertext with its 16-byte tag, so 36 bytes and a third longer than what it
-- seals; a text made of several (a head the database wrote from sealed members, a
-- chunk's messages joined) counts each. Size limits count what GetState returns, so
-- they count the plaintext.
CREATE OR REPLACE FUNCTION agentstate_plain_length(p_text text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN left(p_text, 1) = chr(1) AND strpos(substr(p_text, 2), chr(1)) = 0
            THEN (octet_length(p_text) - 1) * 3 / 4
                 - (octet_length(p_text) - octet_length(rtrim(p_text, '='))) - 36
        WHEN strpos(p_text, chr(1)) = 0 THEN octet_length(p_text)
        ELSE octet_length(p_text) - (
            SELECT coalesce(sum(octet_length(t[1]) - ((octet_length(t[1]) - 1) * 3 / 4
                                - (octet_length(t[1]) - octet_length(rtrim(t[1], '=')))
                                - 36)), 0)
            FROM regexp_matches(p_text, chr(1) || '[A-Za-z0-9+/]*=*', 'g') AS t)
    END::bigint
$$;
