-- Named queries of projection checkpoints (sql/projection_store.py). {schema} is the service schema.

-- ensure_checkpoint --
INSERT INTO {schema}.projection_checkpoints (projection, state)
VALUES (%(projection)s, %(state)s)
ON CONFLICT (projection) DO NOTHING

-- lock_checkpoint --
-- Every batch begins here, after taking the checkpoint's transaction-scoped advisory lock
-- (see lock_checkpoint in projection_store.py): a rebuild's switch-over takes the same lock,
-- so it waits for the batch in flight, and the next batch waits for it. Not FOR UPDATE: a
-- row lock would give the batch a transaction id before it reads, and hold back the horizon
-- of every reader (its own high-water mark included) for the whole batch.
SELECT projection, tx_id::text::bigint AS tx_id, position, events_applied, state, last_error, error_position
  FROM {schema}.projection_checkpoints
 WHERE projection = %(projection)s

-- advance_checkpoint --
-- A checkpoint never moves back: the WHERE refuses a pair at or below the stored one.
UPDATE {schema}.projection_checkpoints
   SET tx_id = %(tx_id)s::text::xid8, position = %(position)s, events_applied = events_applied + %(applied)s,
       state = CASE WHEN state = 'failed' THEN 'running' ELSE state END,
       last_error = CASE WHEN state = 'failed' THEN NULL ELSE last_error END,
       error_position = CASE WHEN state = 'failed' THEN NULL ELSE error_position END,
       updated_at = now()
 WHERE projection = %(projection)s AND (tx_id, position) < (%(tx_id)s::text::xid8, %(position)s)

-- mark_failed --
UPDATE {schema}.projection_checkpoints
   SET state = 'failed', last_error = %(error)s, error_position = %(position)s, updated_at = now()
 WHERE projection = %(projection)s

-- clear_setup_failure --
-- A failure with no event position (the tables could not be created) ends once they are;
-- a bad event's failure ends only when the checkpoint moves past it (advance_checkpoint).
UPDATE {schema}.projection_checkpoints
   SET state = 'running', last_error = NULL, updated_at = now()
 WHERE projection = %(projection)s AND state = 'failed' AND error_position IS NULL

-- insert_dead_letter --
INSERT INTO {schema}.projection_dead_letters (projection, position, tx_id, stream_id, version, type, reason)
VALUES (%(projection)s, %(position)s, %(tx_id)s::text::xid8, %(stream_id)s, %(version)s, %(type)s, %(reason)s)

-- adopt_checkpoint --
-- The switch-over of a rebuild: the live row takes the rebuild's place in the log.
UPDATE {schema}.projection_checkpoints AS live
   SET tx_id = r.tx_id, position = r.position, events_applied = r.events_applied, state = 'running',
       last_error = NULL, error_position = NULL, updated_at = now()
  FROM {schema}.projection_checkpoints AS r
 WHERE live.projection = %(projection)s AND r.projection = %(rebuild)s

-- delete_checkpoint --
DELETE FROM {schema}.projection_checkpoints WHERE projection = %(projection)s

-- list_checkpoints --
SELECT projection, tx_id::text::bigint AS tx_id, position, events_applied, state, last_error, error_position,
       updated_at
  FROM {schema}.projection_checkpoints
 ORDER BY projection

-- lag --
-- Events not applied yet (counted up to a cap), and the age of the next one to apply.
SELECT (SELECT count(*) FROM (SELECT 1 FROM {schema}.events
                               WHERE (tx_id, position) > (%(tx_id)s::text::xid8, %(position)s)
                               LIMIT %(cap)s) AS waiting) AS events,
       coalesce(extract(epoch FROM clock_timestamp() - (
           SELECT recorded_at FROM {schema}.events
            WHERE (tx_id, position) > (%(tx_id)s::text::xid8, %(position)s)
            ORDER BY tx_id, position LIMIT 1)), 0)::float8 AS seconds

-- dependents --
-- Objects that depend on the given tables and would not go with them on their own: views
-- and materialized views (through their rewrite rules), foreign keys of other tables, and
-- any other normal dependency. The tables' own constraints, rules, indexes and sequences
-- are not listed. %(tables)s are qualified, quoted names; a missing table has none.
WITH tables AS (SELECT to_regclass(name)::oid AS oid FROM unnest(%(tables)s::text[]) AS name)
SELECT DISTINCT
       CASE WHEN r.oid IS NULL THEN pg_describe_object(d.classid, d.objid, 0)
            WHEN v.relkind = 'v' THEN 'view ' || v.oid::regclass::text
            WHEN v.relkind = 'm' THEN 'materialized view ' || v.oid::regclass::text
            ELSE 'rule ' || r.rulename || ' on ' || v.oid::regclass::text
       END AS dependent,
       d.refobjid::regclass::text AS on_table
  FROM pg_depend AS d
  LEFT JOIN pg_rewrite AS r ON d.classid = 'pg_rewrite'::regclass AND r.oid = d.objid
  LEFT JOIN pg_class AS v ON v.oid = r.ev_class
  LEFT JOIN pg_constraint AS c ON d.classid = 'pg_constraint'::regclass AND c.oid = d.objid
 WHERE d.refclassid = 'pg_class'::regclass
   AND d.deptype = 'n'
   AND d.refobjid IN (SELECT oid FROM tables WHERE oid IS NOT NULL)
   AND NOT coalesce(coalesce(r.ev_class, c.conrelid) IN (SELECT oid FROM tables WHERE oid IS NOT NULL), false)
 ORDER BY dependent, on_table

-- lock_holder --
-- The backend holding a session advisory lock on this database, by its 64-bit key.
SELECT pid
  FROM pg_locks
 WHERE locktype = 'advisory' AND granted AND objsubid = 1
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND ((classid::bigint << 32) | objid::bigint) = hashtextextended(%(key)s, 0)

-- oldest_writer --
-- The transaction that holds the server's oldest running transaction id: while it runs, no
-- event of a later transaction, in any database of the server, is safe to project.
SELECT pid, backend_xid::text AS xid, datname AS database, application_name,
       extract(epoch FROM clock_timestamp() - xact_start)::float8 AS age_seconds, state
  FROM pg_stat_activity
 WHERE backend_xid IS NOT NULL
 ORDER BY age(backend_xid) DESC
 LIMIT 1

-- oldest_prepared --
SELECT transaction::text AS xid, gid, database,
       extract(epoch FROM clock_timestamp() - prepared)::float8 AS age_seconds
  FROM pg_prepared_xacts
 ORDER BY age(transaction) DESC
 LIMIT 1
