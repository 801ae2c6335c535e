-- Recorded by a trigger, so every way of granting a lease (BeginTurn,
-- AcquireLease, whatever replaces them) keeps the fence current. The granting
-- statement already holds the conversation's row lock.
CREATE OR REPLACE FUNCTION agentstate_record_lease_task() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE t_conversation SET last_task_id = NEW.task_id
    WHERE user_id = NEW.user_id AND id = NEW.conversation_id;
    RETURN NULL;
END $$;
