-- Named queries of sql/heartbeats.py: the heartbeat rows of a service's long-running processes.

-- beat --
-- Insert or refresh one process's row for one role; started_at stays what the first beat set.
INSERT INTO {schema}.heartbeats
       (process_id, kind, serves, threads, host, pid, version, beat_interval, started_at, last_beat)
VALUES (%(process_id)s, %(kind)s, %(serves)s, %(threads)s, %(host)s, %(pid)s, %(version)s, %(beat_interval)s,
        {schema}.clock_now(), {schema}.clock_now())
ON CONFLICT (process_id, kind) DO UPDATE
   SET serves = EXCLUDED.serves, threads = EXCLUDED.threads, beat_interval = EXCLUDED.beat_interval,
       last_beat = EXCLUDED.last_beat

-- remove --
DELETE FROM {schema}.heartbeats WHERE process_id = %(process_id)s

-- prune_heartbeats --
-- Rows of processes that stopped beating long ago (killed, their host gone).
DELETE FROM {schema}.heartbeats WHERE last_beat < {schema}.clock_now() - %(older_than)s::interval

-- list_heartbeats --
-- Every row, with its age on the schema's clock and whether it beat within the last three beats.
SELECT process_id, kind, serves, threads, host, pid, version, started_at, last_beat, beat_interval,
       extract(epoch FROM {schema}.clock_now() - last_beat)::float8 AS age_seconds,
       last_beat >= {schema}.clock_now() - make_interval(secs => %(missed)s * beat_interval) AS live
  FROM {schema}.heartbeats
 ORDER BY kind, host, pid, started_at
