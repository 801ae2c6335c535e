-- Trigger: a conversation's labels as rows of t_conversation_label, so that a page of
-- the conversations with a label walks one index and stops at the page. The rows are
-- this conversation's (its user's) only.
CREATE OR REPLACE FUNCTION agentstate_index_labels() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        DELETE FROM t_conversation_label
        WHERE user_id = NEW.user_id AND conversation_id = NEW.id;
    END IF;
    INSERT INTO t_conversation_label (user_id, key, value, conversation_id)
    SELECT NEW.user_id, l.key, l.value, NEW.id FROM jsonb_each_text(NEW.labels) AS l;
    RETURN NULL;
END $$;
