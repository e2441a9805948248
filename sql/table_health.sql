-- Named queries of sql/table_health.py: what PostgreSQL's statistics say about a service's
-- busiest tables. {schema} is unused: the statistics views take the schema as a value.

-- vacuum_stats --
-- n_dead_tup is an estimate the statistics system keeps (a backend reports its counts within
-- a second or so of its transaction's end); last_autovacuum is NULL until autovacuum first ran.
SELECT relname::text, n_dead_tup, coalesce(extract(epoch FROM last_autovacuum), 0)::float8
  FROM pg_stat_user_tables
 WHERE schemaname = %(schema)s AND relname = ANY(%(tables)s)
 ORDER BY relname
