-- Named queries of the event store (sql/event_store.py). {schema} is the service schema.
-- An append is one statement: WITH stream AS (<one of the stream_* bodies>) <insert_events>.

-- stream_expected --
UPDATE {schema}.streams
   SET version = version + %(count)s, last_tx_id = pg_current_xact_id(), updated_at = now()
 WHERE stream_id = %(stream_id)s
   AND version = %(expected)s
   AND last_tx_id <= pg_current_xact_id()
RETURNING version - %(count)s AS base

-- stream_new --
INSERT INTO {schema}.streams (stream_id, type, version, last_tx_id)
VALUES (%(stream_id)s, %(stream_type)s, %(count)s, pg_current_xact_id())
ON CONFLICT (stream_id) DO NOTHING
RETURNING 0::bigint AS base

-- stream_any --
INSERT INTO {schema}.streams AS s (stream_id, type, version, last_tx_id)
VALUES (%(stream_id)s, %(stream_type)s, %(count)s, pg_current_xact_id())
ON CONFLICT (stream_id) DO UPDATE
   SET version = s.version + excluded.version, last_tx_id = excluded.last_tx_id, updated_at = now()
 WHERE s.last_tx_id <= excluded.last_tx_id
RETURNING version - %(count)s AS base

-- insert_events --
-- The stream CTE runs (and takes the transaction id) before any row is inserted, so every
-- position is drawn after its transaction id: the high-water mark depends on that order.
INSERT INTO {schema}.events (stream_id, version, event_id, type, schema_version, data, metadata)
-- The data and metadata come as two JSON arrays (one document each: cheaper to send than jsonb[]).
SELECT %(stream_id)s, stream.base + e.n, e.event_id, e.type, e.schema_version, e.data, e.metadata
  FROM stream,
       ROWS FROM (unnest(%(event_ids)s::uuid[]), unnest(%(types)s::text[]), unnest(%(schema_versions)s::int[]),
                  jsonb_array_elements(%(data)s::jsonb), jsonb_array_elements(%(metadata)s::jsonb))
       WITH ORDINALITY AS e (event_id, type, schema_version, data, metadata, n)
 ORDER BY e.n
RETURNING position, version, tx_id::text::bigint AS tx_id, recorded_at

-- stream_state --
SELECT version, type, last_tx_id::text::bigint AS last_tx_id, last_tx_id > pg_current_xact_id() AS newer_writer
  FROM {schema}.streams
 WHERE stream_id = %(stream_id)s

-- read_stream --
-- JSON columns come as text: json.loads on a str is much cheaper than the driver's jsonb loader.
SELECT position, tx_id::text::bigint AS tx_id, stream_id, version, event_id, type, schema_version, data::text AS data,
       metadata::text AS metadata, recorded_at
  FROM {schema}.events
 WHERE stream_id = %(stream_id)s
   AND version > %(after_version)s
   AND version <= %(up_to_version)s
   AND position <= %(up_to_position)s
   AND recorded_at <= %(as_of)s
 ORDER BY version

-- read_positions --
-- Events in position order. Only final below a high-water mark: a row with a smaller
-- position may still commit after a larger one was read.
SELECT position, tx_id::text::bigint AS tx_id, stream_id, version, event_id, type, schema_version, data::text AS data,
       metadata::text AS metadata, recorded_at
  FROM {schema}.events
 WHERE position > %(after)s AND position <= %(up_to)s
 ORDER BY position
 LIMIT %(limit)s

-- read_safe --
-- Gap-safe catch-up: only rows of transactions that have ended (below the oldest running
-- transaction id of the server, taken from this statement's own snapshot), in the order
-- (tx_id, position). No row can later appear before the last one returned.
SELECT position, tx_id::text::bigint AS tx_id, stream_id, version, event_id, type, schema_version,
       CASE WHEN %(all_types)s OR type = ANY(%(types)s) THEN data::text END AS data,
       metadata::text AS metadata, recorded_at
  FROM {schema}.events
 WHERE (tx_id, position) > (%(after_tx_id)s::text::xid8, %(after_position)s)
   AND tx_id < pg_snapshot_xmin(pg_current_snapshot())
 -- Qualified: a bare "tx_id" would name the output column (the bigint), and sort everything after the checkpoint.
 ORDER BY events.tx_id, events.position
 LIMIT %(limit)s

-- held_back --
-- Committed rows past the checkpoint that are not safe to read yet (an older transaction
-- is still running somewhere on the server).
SELECT count(*)
  FROM {schema}.events
 WHERE (tx_id, position) > (%(after_tx_id)s::text::xid8, %(after_position)s)
   AND tx_id >= pg_snapshot_xmin(pg_current_snapshot())

-- version_as_of --
SELECT coalesce(max(version), 0)
  FROM {schema}.events
 WHERE stream_id = %(stream_id)s AND recorded_at <= %(as_of)s AND position <= %(up_to_position)s

-- last_position --
SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {schema}.event_positions

-- insert_snapshot --
INSERT INTO {schema}.snapshots (stream_id, aggregate, schema_version, version, fingerprint, state)
VALUES (%(stream_id)s, %(aggregate)s, %(schema_version)s, %(version)s, %(fingerprint)s, %(state)s)
ON CONFLICT (stream_id, aggregate, schema_version, version) DO NOTHING

-- latest_snapshot --
SELECT version, fingerprint, state
  FROM {schema}.snapshots
 WHERE stream_id = %(stream_id)s AND aggregate = %(aggregate)s AND schema_version = %(schema_version)s
   AND version <= %(up_to_version)s
 ORDER BY version DESC
 LIMIT 1
