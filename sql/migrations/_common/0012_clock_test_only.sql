-- Only a session that asks for the test clock may move it.
--
-- The clock table moves the time of every decision the schema makes: an eight-day skew lets
-- the inbox pruning delete a record written seconds ago (a redelivered charge would run
-- again), a stopped_at freezes every deadline and delay. Before this, any role holding the
-- usual DML grant on the schema's tables (GRANT ... ON ALL TABLES IN SCHEMA includes this
-- one) moved it with a plain INSERT, and the trigger of 0011, running as the table's owner,
-- needed no other privilege.
--
-- Now a write that puts or changes a row (INSERT, UPDATE, COPY) is refused unless the
-- transaction or session set estafeta.test_clock = on, as estafeta's test clock does
-- (sql/clock.py, for estafeta.testing's `clock` fixture). Emptying the table (DELETE,
-- TRUNCATE) is always allowed: it gives PostgreSQL's own time back, which is what an
-- operator who finds a moved clock does (docs/operations/runbook.md, EstafetaClockMoved).
-- Any role may set a custom setting: this stops a write that did not mean to move the time,
-- not a role bent on it. Whoever moved it, a moved clock shows in the estafeta_clock_moved
-- gauge and in a warning at each estafeta process's start.
CREATE FUNCTION clock_refuse_unless_test() RETURNS trigger LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp AS $refuse$
BEGIN
    IF coalesce(current_setting('estafeta.test_clock', true), '') <> 'on' THEN
        RAISE EXCEPTION '%.clock is a test''s clock: writing it moves the time of every decision in the schema',
                TG_TABLE_SCHEMA
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Only a test moves it (estafeta.Clock sets estafeta.test_clock = on for its writes); '
                         'DELETE FROM the table gives PostgreSQL''s time back.';
    END IF;
    RETURN NULL;
END
$refuse$;

CREATE TRIGGER clock_refuse_unless_test BEFORE INSERT OR UPDATE ON clock
    FOR EACH STATEMENT EXECUTE FUNCTION clock_refuse_unless_test();
