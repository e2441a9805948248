-- Named queries of the eventsourcing library's recorders on estafeta's event store
-- (sql/eventsourcing_store.py). {schema} is the service schema. An eventsourcing
-- originator_version v is stored as the stream version v + 1 (estafeta counts from 1,
-- the library's aggregates may start at 0).

-- claim_streams --
-- First statement of a write: takes the transaction id (before any position is drawn, as
-- the high-water mark requires), locks each stream's row in stream-id order (two writers
-- of one stream queue here; two batches never deadlock), and refuses a stream last
-- written by a newer transaction (projections read in transaction-id order). A stream
-- missing from the result is such a refusal.
INSERT INTO {schema}.streams AS s (stream_id, type, version, last_tx_id)
SELECT u.stream_id, 'eventsourcing', u.version, pg_current_xact_id()
  FROM unnest(%(stream_ids)s::text[], %(versions)s::bigint[]) AS u (stream_id, version)
 ORDER BY u.stream_id
ON CONFLICT (stream_id) DO UPDATE
   SET version = greatest(s.version, excluded.version), last_tx_id = excluded.last_tx_id, updated_at = now()
 WHERE s.last_tx_id <= excluded.last_tx_id
RETURNING stream_id

-- lock_positions --
-- Held from just before the events are inserted to just after (never to commit), so that
-- the positions of one batch are contiguous among the adapter's writers.
SELECT pg_advisory_lock(hashtextextended('estafeta.eventsourcing:' || %(schema_name)s, 0))

-- unlock_positions --
SELECT pg_advisory_unlock(hashtextextended('estafeta.eventsourcing:' || %(schema_name)s, 0))

-- insert_events --
-- A duplicate (stream, version) is a unique violation: the library's optimistic concurrency.
INSERT INTO {schema}.events (stream_id, version, event_id, type, schema_version, data)
SELECT e.stream_id, e.version, gen_random_uuid(), e.type, 1, e.data
  FROM ROWS FROM (unnest(%(stream_ids)s::text[]), unnest(%(versions)s::bigint[]), unnest(%(types)s::text[]),
                  jsonb_array_elements(%(data)s::jsonb))
       WITH ORDINALITY AS e (stream_id, version, type, data, n)
 ORDER BY e.n
RETURNING stream_id, version, position

-- select_stream_asc --
SELECT stream_id, version, type, data::text
  FROM {schema}.events
 WHERE stream_id = %(stream_id)s AND version > %(after)s AND version <= %(up_to)s
 ORDER BY version
 LIMIT %(limit)s

-- select_stream_desc --
SELECT stream_id, version, type, data::text
  FROM {schema}.events
 WHERE stream_id = %(stream_id)s AND version > %(after)s AND version <= %(up_to)s
 ORDER BY version DESC
 LIMIT %(limit)s

-- select_notifications --
-- Only ever called with up_to at most a high-water mark: nothing can appear below it later.
SELECT position, stream_id, version, type, data::text
  FROM {schema}.events
 WHERE position >= %(first)s AND position <= %(up_to)s
   AND (%(all_topics)s OR type = ANY(%(topics)s))
 ORDER BY position
 LIMIT %(limit)s

-- max_position --
SELECT max(position) FROM {schema}.events WHERE position <= %(up_to)s

-- insert_tracking --
-- Returns no row when the application's position is already at or past this id.
INSERT INTO {schema}.eventsourcing_tracking AS t (application_name, notification_id)
VALUES (%(application_name)s, %(notification_id)s)
ON CONFLICT (application_name) DO UPDATE
   SET notification_id = excluded.notification_id, updated_at = now()
 WHERE t.notification_id < excluded.notification_id
RETURNING notification_id

-- max_tracking_id --
SELECT notification_id FROM {schema}.eventsourcing_tracking WHERE application_name = %(application_name)s

-- insert_snapshots --
INSERT INTO {schema}.eventsourcing_snapshots (originator_id, originator_version, topic, state)
SELECT * FROM unnest(%(stream_ids)s::text[], %(versions)s::bigint[], %(types)s::text[], %(states)s::bytea[])

-- select_snapshots_asc --
SELECT originator_id, originator_version, topic, state
  FROM {schema}.eventsourcing_snapshots
 WHERE originator_id = %(stream_id)s AND originator_version > %(after)s AND originator_version <= %(up_to)s
 ORDER BY originator_version
 LIMIT %(limit)s

-- select_snapshots_desc --
SELECT originator_id, originator_version, topic, state
  FROM {schema}.eventsourcing_snapshots
 WHERE originator_id = %(stream_id)s AND originator_version > %(after)s AND originator_version <= %(up_to)s
 ORDER BY originator_version DESC
 LIMIT %(limit)s
