-- The schema's clock: every decision that depends on the time (a delayed outbox row falling
-- due, a retry's backoff, a saga's deadline, an idempotency record's expiry, retention) reads
-- clock_now() instead of now(). In production the clock table is empty and clock_now() is
-- now(), the transaction's start, as before; a test (estafeta.testing's `clock` fixture)
-- writes a skew into it to move the schema's time forward without sleeping. The function is
-- a one-SELECT STABLE SQL function, so PostgreSQL inlines it into each query: no extra
-- round trip, and the empty table costs one page look-up per statement.
CREATE TABLE clock (
    -- One row at most.
    only_row  boolean  PRIMARY KEY DEFAULT true CHECK (only_row),
    -- How far this schema's time is ahead of PostgreSQL's now().
    skew      interval NOT NULL
);

-- Qualified with the schema it lives in, so the function reads its own clock whatever the
-- caller's search_path is.
DO $clock$
BEGIN
    EXECUTE format(
        $f$CREATE FUNCTION %1$I.clock_now() RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE
           AS 'SELECT now() + coalesce((SELECT skew FROM %1$I.clock), interval ''0'')'$f$,
        current_schema());
END
$clock$;

-- The rows whose timestamps retention and pruning compare with clock_now() take it too.
ALTER TABLE inbox ALTER COLUMN processed_at SET DEFAULT clock_now();
ALTER TABLE inbox_attempts ALTER COLUMN last_attempt_at SET DEFAULT clock_now();
ALTER TABLE dead_letters ALTER COLUMN created_at SET DEFAULT clock_now();
ALTER TABLE fences ALTER COLUMN raised_at SET DEFAULT clock_now();
ALTER TABLE outbox ALTER COLUMN available_at SET DEFAULT clock_now();
