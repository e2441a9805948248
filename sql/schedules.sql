-- Named queries of the schedules table (migrations/_schedules), parsed once by
-- sql/queries.py. `{schema}` is the service's schema.

-- register_schedule --
-- A declared schedule's row, created at its first tick after now. A declaration that
-- changed (another spec) starts again from the first tick of the new one, keeping its
-- history, and so does one declared again after an absence longer than `absence` (as
-- after a pause: the ticks of the absence are neither fired nor missed); a shorter absence
-- is only forgotten, its ticks caught up like a downtime's. Returns the row's name.
INSERT INTO {schema}.schedules AS s (name, spec, next_fire_at)
VALUES (%(name)s, %(spec)s, %(next_fire_at)s)
ON CONFLICT (name) DO UPDATE SET
    spec = excluded.spec,
    next_fire_at = CASE WHEN s.spec IS DISTINCT FROM excluded.spec
        OR s.absent_since <= {schema}.clock_now() - %(absence)s::interval
        THEN excluded.next_fire_at ELSE s.next_fire_at END,
    attempted_tick = CASE WHEN s.spec IS DISTINCT FROM excluded.spec
        OR s.absent_since <= {schema}.clock_now() - %(absence)s::interval
        THEN NULL ELSE s.attempted_tick END,
    last_outcome = CASE WHEN s.spec = excluded.spec
        AND s.absent_since <= {schema}.clock_now() - %(absence)s::interval
        THEN 'declared again after an absence: restarted at its first tick after now' ELSE s.last_outcome END,
    last_outcome_at = CASE WHEN s.spec = excluded.spec
        AND s.absent_since <= {schema}.clock_now() - %(absence)s::interval
        THEN {schema}.clock_now() ELSE s.last_outcome_at END,
    absent_since = NULL
    WHERE s.spec IS DISTINCT FROM excluded.spec OR s.absent_since IS NOT NULL
RETURNING name

-- restart_schedule --
-- register_schedule that also restarts an unchanged schedule at `next_fire_at` (a test's
-- clock jumped: the ticks between are neither due nor missed).
INSERT INTO {schema}.schedules AS s (name, spec, next_fire_at)
VALUES (%(name)s, %(spec)s, %(next_fire_at)s)
ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, next_fire_at = excluded.next_fire_at,
    attempted_tick = NULL, absent_since = NULL
RETURNING name

-- create_schedule --
-- A declared schedule's row at its first tick after now, if it has none (an operator's
-- command before any worker ran it); an existing row is left as it is.
INSERT INTO {schema}.schedules (name, spec, next_fire_at)
VALUES (%(name)s, %(spec)s, %(next_fire_at)s)
ON CONFLICT (name) DO NOTHING

-- mark_absent_schedules --
-- The rows of the service that the registering worker's code does not declare: absent from
-- now on, unless already absent (the first worker to miss it says since when).
UPDATE {schema}.schedules SET absent_since = {schema}.clock_now()
WHERE name <> ALL(%(declared)s) AND absent_since IS NULL

-- due_schedules --
-- The names of the declared schedules whose next tick has come, most overdue first.
SELECT name FROM {schema}.schedules
WHERE name = ANY(%(names)s) AND NOT paused AND next_fire_at <= {schema}.clock_now()
ORDER BY next_fire_at

-- next_schedule_due --
-- Seconds until the next tick of a declared, running schedule (NULL: none).
SELECT extract(epoch FROM min(next_fire_at) - {schema}.clock_now())::float8
FROM {schema}.schedules WHERE name = ANY(%(names)s) AND NOT paused

-- begin_attempt --
-- Before a firing transaction, committed on its own: the due tick it is about to fire. The
-- tick an earlier pass wrote there and did not clear (its firing never committed) comes
-- back as `interrupted`. A row another transaction holds (being fired), paused, not due or
-- declared otherwise is left alone: no row.
WITH due AS (
    SELECT name, attempted_tick FROM {schema}.schedules
    WHERE name = %(name)s AND spec = %(spec)s AND NOT paused AND next_fire_at <= {schema}.clock_now()
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.schedules AS s SET attempted_tick = s.next_fire_at
FROM due WHERE s.name = due.name
RETURNING CASE WHEN due.attempted_tick = s.next_fire_at THEN due.attempted_tick END AS interrupted

-- claim_due_schedule --
-- The row of a schedule whose tick has come, locked for the firing transaction. A row
-- another process is firing is skipped, never waited for: that process fires the tick,
-- and once it commits next_fire_at has moved past it, so nobody else sees it due.
SELECT *, {schema}.clock_now() AS now FROM {schema}.schedules
WHERE name = %(name)s AND NOT paused AND next_fire_at <= {schema}.clock_now()
FOR UPDATE SKIP LOCKED

-- lock_schedule --
-- A schedule's row for an operator's change (pause, resume, trigger): waits for a firing.
SELECT *, {schema}.clock_now() AS now FROM {schema}.schedules WHERE name = %(name)s FOR UPDATE

-- record_firing --
-- What a firing transaction did, written in it: the next tick, and the last outcome. It
-- clears the tick its pass began with (begin_attempt), unless `keep_attempt` (an
-- operator's trigger, which fires no tick).
UPDATE {schema}.schedules SET
    next_fire_at = %(next_fire_at)s,
    attempted_tick = CASE WHEN %(keep_attempt)s THEN attempted_tick END,
    last_tick = coalesce(%(last_tick)s, last_tick),
    last_fired_at = CASE WHEN %(last_tick)s::timestamptz IS NULL THEN last_fired_at ELSE {schema}.clock_now() END,
    last_message_id = coalesce(%(last_message_id)s, last_message_id),
    last_actor = coalesce(%(last_actor)s, last_actor),
    last_outcome = %(outcome)s,
    last_outcome_at = {schema}.clock_now(),
    fired = fired + %(fired)s,
    skipped = skipped + %(skipped)s,
    missed = missed + %(missed)s
WHERE name = %(name)s

-- set_schedule_paused --
UPDATE {schema}.schedules SET paused = %(paused)s,
    next_fire_at = coalesce(%(next_fire_at)s, next_fire_at), attempted_tick = NULL,
    last_outcome = %(outcome)s, last_outcome_at = {schema}.clock_now()
WHERE name = %(name)s

-- list_schedules --
SELECT *, {schema}.clock_now() AS now FROM {schema}.schedules ORDER BY name

-- get_schedule --
SELECT *, {schema}.clock_now() AS now FROM {schema}.schedules WHERE name = %(name)s

-- message_in_outbox --
-- Whether a message is still in this outbox (pending or failed): not published yet.
SELECT status FROM {schema}.outbox WHERE message_id = %(message_id)s

-- message_handled --
-- Whether the consumer is done with a message: processed (its inbox row) or dead-lettered.
SELECT CASE
    WHEN EXISTS (SELECT FROM {schema}.inbox WHERE consumer = %(consumer)s AND message_id = %(message_id)s)
        THEN 'processed'
    WHEN EXISTS (SELECT FROM {schema}.dead_letters WHERE consumer = %(consumer)s AND message_id = %(message_id)s::text)
        THEN 'dead-lettered'
END
