-- Opt-in, after _events: `events` becomes a table partitioned by recorded_at (range), for
-- stores large enough that old months should be detached and archived (seed 000). A service
-- opts in with service.use_events(registry) then
-- service.use_builtin_migrations("_events_partitioned"). Applied with search_path set to the
-- service's schema; the events already stored are copied in this migration's transaction.
--
-- What changes. A unique index of a partitioned table must contain the partition key, so
-- nothing in the table itself rejects a second (stream_id, version), a second position or a
-- second event id. Optimistic concurrency rests on the `streams` row: every append through
-- sql/event_store.py first updates (or inserts) its stream's row with the expected version
-- in the statement, and holds that row lock to commit, so two writers of one stream queue
-- there and the second finds its version gone. Positions come from the sequence and event
-- ids from the appender (uuid4): both stay unique without an index to say so.
-- Not for the eventsourcing library's recorders (estafeta.eventsourcing): they rely on the
-- unique (stream_id, version) to refuse a duplicate, so this migration refuses their schemas.
--
-- Partitions: everything lands in events_default until an operator (or pg_partman) creates
-- monthly partitions ahead of time, e.g.
--     CREATE TABLE orders.events_2027_01 PARTITION OF orders.events
--         FOR VALUES FROM ('2027-01-01') TO ('2027-02-01');
-- A partition cannot be created over a range events_default already holds rows of.

DO $$
BEGIN
    IF to_regclass('events') IS NULL THEN
        RAISE EXCEPTION 'no events table in schema %: apply _events first (Service.use_events before'
                        ' use_builtin_migrations(''_events_partitioned''))', current_schema();
    END IF;
    IF to_regclass('eventsourcing_snapshots') IS NOT NULL THEN
        RAISE EXCEPTION 'schema % holds the eventsourcing library''s tables, whose recorders need the unique'
                        ' (stream_id, version) a partitioned events table cannot have', current_schema();
    END IF;
END
$$;

CREATE TABLE events_partitioned (
    position       bigint      NOT NULL DEFAULT nextval('event_positions'),
    tx_id          xid8        NOT NULL DEFAULT pg_current_xact_id(),
    stream_id      text        NOT NULL,
    version        bigint      NOT NULL CHECK (version > 0),
    event_id       uuid        NOT NULL,
    type           text        NOT NULL,
    schema_version int         NOT NULL CHECK (schema_version > 0),
    data           jsonb       NOT NULL,
    metadata       jsonb       NOT NULL DEFAULT '{}',
    recorded_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- A backstop only within one partition: the streams row is what refuses a duplicate.
    CONSTRAINT events_partitioned_pkey PRIMARY KEY (stream_id, version, recorded_at)
) PARTITION BY RANGE (recorded_at);
CREATE TABLE events_default PARTITION OF events_partitioned DEFAULT;

INSERT INTO events_partitioned (position, tx_id, stream_id, version, event_id, type, schema_version, data,
                                metadata, recorded_at)
SELECT position, tx_id, stream_id, version, event_id, type, schema_version, data, metadata, recorded_at
  FROM events;

-- The sequence would go with the table that owns it.
ALTER SEQUENCE event_positions OWNED BY NONE;
DROP TABLE events;
ALTER TABLE events_partitioned RENAME TO events;
ALTER INDEX events_partitioned_pkey RENAME TO events_pkey;
ALTER SEQUENCE event_positions OWNED BY events.position;

-- The reading orders: projections (tx_id, position), the log (position).
CREATE INDEX events_tx_position ON events (tx_id, position);
CREATE INDEX events_position ON events (position);

-- The triggers of _events, on the new table (their functions stayed).
CREATE TRIGGER events_wake AFTER INSERT ON events FOR EACH STATEMENT EXECUTE FUNCTION events_wake();
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_append_only();
