-- A saga the watchdog gave up on (its command, a step past the point of no return or a
-- compensation, got no reply after all its attempts) has a status of its own, `gave_up`,
-- apart from `failed`: the participant may still act, and its late answer moves the saga on.
-- Applied with search_path set to the owning service's schema; the table bound as an identifier.

-- The status CHECK was named by PostgreSQL when the table was made (and shortened to fit 63
-- bytes for a long table name): found by what it checks, not by a name built here.
DO $$
DECLARE
    check_name name;
BEGIN
    FOR check_name IN
        SELECT c.conname FROM pg_constraint AS c
        WHERE c.conrelid = '{table}'::regclass AND c.contype = 'c'
          AND pg_get_constraintdef(c.oid) LIKE '%status%''failed''%'
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', '{table}'::regclass, check_name);
    END LOOP;
END
$$;
ALTER TABLE {table}
    ADD CHECK (status IN ('running', 'compensating', 'gave_up', 'completed', 'compensated', 'failed'));

-- Sagas failed that way before this migration get the new status, so that a late answer
-- still moves them on: the engine now knows them by their status, no longer by their error.
-- Their version is kept (a late answer carries the version before the give-up).
UPDATE {table}
SET status = 'gave_up'
WHERE status = 'failed'
  AND starts_with(last_error,
                  CASE WHEN compensations IS NULL THEN '' ELSE 'compensation ' END || current_step
                  || ': no reply after ');
