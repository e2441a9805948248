-- clock_now() costs nothing until a test moves the clock.
--
-- 0007 said PostgreSQL inlines the one-SELECT SQL function into each query. It does not: a
-- scalar SQL function is inlined only if its body has no sub-SELECT, and this one reads the
-- clock table in one. A SQL function that is not inlined keeps its plan for one execution of
-- the calling statement only, so every statement that called it (each inbox record's and
-- outbox row's default, a saga's deadline, about ten calls per saga step) parsed, analysed
-- and planned the function's body again: 14% of PostgreSQL's CPU in bench.sagas (perf, see
-- docs/performance.md). Written in PL/pgSQL, the body is planned once per connection, and
-- each call still runs a query on the clock table: 6%.
--
-- So while the clock table is empty (always, in production) clock_now() is `SELECT now()`,
-- which PostgreSQL inlines: the statements that call it read now() as they would have. The
-- first write to the table (sql/clock.py: a test moving or stopping the clock) makes it the
-- PL/pgSQL function that reads the table; emptying the table (a reset, a TRUNCATE) gives the
-- free one back. Replacing a function invalidates every cached plan that inlined it, in every
-- session, so a statement prepared before a move reads the moved clock at its next execution.
-- The trigger's function runs as its owner (who ran the migrations and owns clock_now()), so
-- a role that may only write the clock table can still move it.
CREATE FUNCTION clock_follow_table() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $follow$
DECLARE
    moved boolean;
    language text;
    body text;
BEGIN
    -- One writer at a time per schema: two replacements of one function at once would fail
    -- ("tuple concurrently updated").
    PERFORM pg_advisory_xact_lock(hashtext(TG_TABLE_SCHEMA || '.clock_now'));
    EXECUTE format('SELECT EXISTS (SELECT FROM %I.clock)', TG_TABLE_SCHEMA) INTO moved;
    IF moved THEN
        language := 'plpgsql';
        body := format(
            'BEGIN RETURN coalesce((SELECT coalesce(stopped_at, now() + skew) FROM %I.clock), now()); END',
            TG_TABLE_SCHEMA);
    ELSE
        language := 'sql';
        body := 'SELECT now()';
    END IF;
    IF body IS DISTINCT FROM (SELECT prosrc FROM pg_proc
                              WHERE oid = format('%I.clock_now()', TG_TABLE_SCHEMA)::regprocedure) THEN
        EXECUTE format(
            'CREATE OR REPLACE FUNCTION %I.clock_now() RETURNS timestamptz LANGUAGE %s STABLE PARALLEL SAFE AS %L',
            TG_TABLE_SCHEMA, language, body);
    END IF;
    RETURN NULL;
END
$follow$;

CREATE TRIGGER clock_follow_table AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON clock
    FOR EACH STATEMENT EXECUTE FUNCTION clock_follow_table();

-- The function as the table says now (a schema whose clock a test had moved keeps reading it).
UPDATE clock SET skew = skew;
