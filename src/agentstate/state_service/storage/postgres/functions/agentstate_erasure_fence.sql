-- Trigger: while a user's erase runs (a row in t_erasure_fence), no new row of that
-- user is inserted, so nothing the erase removed can come back. The shared advisory
-- lock pairs with the exclusive one agentstate_erase_begin takes before it puts up the
-- fence: an insert in flight then commits before the fence is up (and the erase's
-- batches see its row), and one that comes after sees the fence. Keyed by this row's
-- user only.
CREATE OR REPLACE FUNCTION agentstate_erasure_fence() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_erasure bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1634956658, hashtext(NEW.user_id));
    SELECT erasure_id INTO v_erasure FROM t_erasure_fence WHERE user_id = NEW.user_id;
    IF FOUND THEN
        PERFORM agentstate_refuse(jsonb_build_object(
            'kind', 'user_being_erased', 'erasure_id', v_erasure));
    END IF;
    RETURN NEW;
END $$;
