-- Trigger: a conversation whose time to live is renewed by each write expires that
-- long after its last change (update_time moves on every write).
CREATE OR REPLACE FUNCTION agentstate_renew_ttl() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.expire_time := NEW.update_time + make_interval(secs => NEW.ttl_seconds);
    RETURN NEW;
END $$;
