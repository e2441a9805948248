-- The console's saga lists (`/console/sagas`): newest first, a page at a time, with a
-- keyset cursor `(started_at, saga_id) < (last row's)`. Each index below serves one filter
-- in that order, so a page reads about one page of index entries, not the table
-- (bench/console.py: on 1,000,000 rows, milliseconds with them, a full scan without).
-- Applied with search_path set to the owning service's schema; names bound as identifiers.
-- CREATE INDEX (not CONCURRENTLY: migrations run in one transaction) blocks writes to the
-- saga table while it builds: on a large table, apply it in a quiet moment.

-- No filter, a time range, or only an error text: walk the newest first.
CREATE INDEX IF NOT EXISTS {newest_index} ON {table} (started_at, saga_id);
-- By status (the overview's counts link here).
CREATE INDEX IF NOT EXISTS {status_index} ON {table} (status, started_at, saga_id);
-- By current step (where sagas wait or stopped).
CREATE INDEX IF NOT EXISTS {step_index} ON {table} (current_step, started_at, saga_id);
-- Status and step go together (compensated sagas stopped at the steps that fail): without
-- this the planner multiplies their selectivities, expects a handful of rows where there
-- are thousands, and sorts them all instead of walking an index (bench/console.py).
CREATE STATISTICS IF NOT EXISTS {stats} (dependencies, mcv) ON status, current_step FROM {table};
-- The first index serves everything the one on started_at alone did.
DROP INDEX IF EXISTS {started_index};
