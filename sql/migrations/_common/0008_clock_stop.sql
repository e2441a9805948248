-- A clock a test can stop: with stopped_at set, clock_now() reads stopped_at and moves only
-- when the test moves it (estafeta.testing's `clock` fixture stops it), instead of running on
-- from the skew with PostgreSQL's time, which made a test's "one tick later" race the wall
-- clock. Production still never writes the table: clock_now() is now().
ALTER TABLE clock ADD COLUMN stopped_at timestamptz;
ALTER TABLE clock ALTER COLUMN skew SET DEFAULT interval '0';

DO $clock$
BEGIN
    EXECUTE format(
        $f$CREATE OR REPLACE FUNCTION %1$I.clock_now() RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE
           AS 'SELECT coalesce((SELECT coalesce(stopped_at, now() + skew) FROM %1$I.clock), now())'$f$,
        current_schema());
END
$clock$;
