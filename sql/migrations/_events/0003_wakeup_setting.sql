-- The wake-up policy (ESTAFETA_WAKEUP, estafeta/messaging/wakeups.py): a transaction or session that set
-- estafeta.wakeup to 'poll' or 'after-commit' appends without a NOTIFY at commit (PostgreSQL
-- serialises the commits of notifying transactions); 'after-commit' steps wake the projectors
-- from a side connection once committed, 'poll' leaves them to their poll. Unset, as before.
CREATE OR REPLACE FUNCTION events_wake() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('estafeta.wakeup', true), '') NOT IN ('poll', 'after-commit') THEN
        PERFORM pg_notify('estafeta_events', TG_TABLE_SCHEMA);
    END IF;
    RETURN NULL;
END
$$;
