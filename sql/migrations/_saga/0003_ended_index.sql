-- The console's charts (`/console/charts`, console/charts.py) count the sagas that
-- completed or compensated in each minute of a window: this index walks only that window
-- of ended sagas instead of scanning the table (bench: 1,000,000 sagas, see
-- docs/how-to/http.md). Live sagas (completed_at NULL) and failed ones are left out.
-- Applied with search_path set to the owning service's schema; names bound as identifiers.
-- CREATE INDEX (not CONCURRENTLY: migrations run in one transaction) blocks writes to the
-- saga table while it builds: on a large table, apply it in a quiet moment.
CREATE INDEX IF NOT EXISTS {ended_index} ON {table} (completed_at) WHERE status IN ('completed', 'compensated');
