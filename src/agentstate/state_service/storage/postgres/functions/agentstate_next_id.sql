CREATE OR REPLACE FUNCTION agentstate_next_id() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT ((floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1288834974657) << 22)
           | (nextval('agentstate_id_seq') % 4194304)
$$;
