-- The event store a service opts into. Applied with search_path set to the service's
-- schema, like _common, so every name below lands in it. Operators query these tables:
-- keep the names and columns stable.

-- Global positions. No cache: a position drawn is at once the sequence's last value, which
-- the integer high-water mark (sql/event_store.py: high_water_mark) relies on.
CREATE SEQUENCE event_positions AS bigint CACHE 1;

-- One row per stream: the current version (the number of events) and the transaction that
-- last appended to it. Appends update this row first, so two writers of one stream queue
-- here, and the second finds the version it expected gone (optimistic concurrency). The row
-- also refuses an append from a transaction older than the stream's last writer, so that
-- (tx_id, position) order, in which projections read, keeps each stream's version order.
CREATE TABLE streams (
    stream_id  text        PRIMARY KEY,
    type       text        NOT NULL,
    version    bigint      NOT NULL CHECK (version > 0),
    last_tx_id xid8        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE events (
    -- The global order in which events were appended (drawn after tx_id was taken).
    position       bigint      NOT NULL DEFAULT nextval('event_positions') UNIQUE,
    -- The appending transaction: readers read only below the oldest running transaction.
    tx_id          xid8        NOT NULL DEFAULT pg_current_xact_id(),
    stream_id      text        NOT NULL,
    version        bigint      NOT NULL CHECK (version > 0),
    event_id       uuid        NOT NULL UNIQUE,
    type           text        NOT NULL,
    schema_version int         NOT NULL CHECK (schema_version > 0),
    data           jsonb       NOT NULL,
    -- causation_id (the message being processed), correlation_id (the saga), traceparent.
    metadata       jsonb       NOT NULL DEFAULT '{}',
    recorded_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (stream_id, version)
);
ALTER SEQUENCE event_positions OWNED BY events.position;

-- The gap-safe reading order of projections and catch-up subscriptions.
CREATE INDEX events_tx_position ON events (tx_id, position);

-- State of an aggregate after `version` events, per aggregate class and its schema version:
-- after a schema change the old rows are ignored (and may be deleted), never misread.
CREATE TABLE snapshots (
    stream_id      text        NOT NULL,
    aggregate      text        NOT NULL,
    schema_version int         NOT NULL,
    version        bigint      NOT NULL,
    -- A digest of the class's fields: a field change without a schema_version bump is caught.
    fingerprint    text        NOT NULL,
    state          jsonb       NOT NULL,
    taken_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream_id, aggregate, schema_version, version)
);

-- Where each projection (read model) is in the event log. A projector updates its row in the
-- transaction that writes the read model, so a crash never applies an event twice nor skips one.
CREATE TABLE projection_checkpoints (
    projection     text        PRIMARY KEY,
    -- The last event applied, in (tx_id, position) order; ('0', 0) before the first.
    tx_id          xid8        NOT NULL DEFAULT '0',
    position       bigint      NOT NULL DEFAULT 0,
    events_applied bigint      NOT NULL DEFAULT 0,
    -- running: applying events; failed: stopped on a bad event (last_error says which);
    -- rebuilding: a side-by-side rebuild (the row of '<name>__rebuild').
    state          text        NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'failed', 'rebuilding')),
    last_error     text,
    error_position bigint,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- Events a projection skipped because it could not apply them (unknown type, failed to
-- decode, handler error), with the reason; only for projections that skip rather than stop.
CREATE TABLE projection_dead_letters (
    projection text        NOT NULL,
    position   bigint      NOT NULL,
    tx_id      xid8        NOT NULL,
    stream_id  text        NOT NULL,
    version    bigint      NOT NULL,
    type       text        NOT NULL,
    reason     text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, position)
);

-- Every statement that inserts events wakes the projectors of this schema at commit (the
-- payload is the schema). A wake-up only: projectors also poll, and read only what is safe.
CREATE FUNCTION events_wake() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('estafeta_events', TG_TABLE_SCHEMA);
    RETURN NULL;
END
$$;
CREATE TRIGGER events_wake AFTER INSERT ON events FOR EACH STATEMENT EXECUTE FUNCTION events_wake();
