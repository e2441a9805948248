-- Named queries of the saga store, parsed once by sql/sagas.py. `{schema}` is the owning
-- service's schema, `{table}` the saga table (saga_<name>), `{log}` its transition log
-- and `{key}` its key column (order_id): all bound as identifiers, never as text.

-- insert_saga --
-- A saga id already there means this start was already done (a retried placement).
INSERT INTO {schema}.{table}
    (saga_id, {key}, status, current_step, payload, step_timeout, deadline_at)
VALUES
    (%(saga_id)s, %(key)s, 'running', %(step)s, %(payload)s, %(step_timeout)s::interval,
     {schema}.clock_now() + %(wait)s::interval)
ON CONFLICT (saga_id) DO NOTHING

-- get_saga --
SELECT saga_id, {key} AS key, status, current_step, payload, results, compensations, attempts,
       step_timeout, deadline_at, started_at, updated_at, completed_at, last_error, version
FROM {schema}.{table}
WHERE saga_id = %(saga_id)s

-- lock_saga --
-- Replies, the watchdog and operators all go through this row lock: one transition at a time.
SELECT saga_id, {key} AS key, status, current_step, payload, results, compensations, attempts,
       step_timeout, deadline_at, started_at, updated_at, completed_at, last_error, version
FROM {schema}.{table}
WHERE saga_id = %(saga_id)s
FOR UPDATE

-- lock_overdue --
-- The watchdog's claim: still live, still past its deadline, and not being handled by
-- another watchdog or a reply right now (SKIP LOCKED: that one will move it on).
SELECT saga_id, {key} AS key, status, current_step, payload, results, compensations, attempts,
       step_timeout, deadline_at, started_at, updated_at, completed_at, last_error, version
FROM {schema}.{table}
WHERE saga_id = %(saga_id)s
  AND status IN ('running', 'compensating')
  AND deadline_at <= {schema}.clock_now()
FOR UPDATE SKIP LOCKED

-- list_overdue --
SELECT saga_id
FROM {schema}.{table}
WHERE status IN ('running', 'compensating') AND deadline_at <= {schema}.clock_now()
ORDER BY deadline_at
LIMIT %(limit)s

-- list_live --
SELECT saga_id
FROM {schema}.{table}
WHERE status IN ('running', 'compensating')
ORDER BY deadline_at
LIMIT %(limit)s

-- transition --
-- Only from the version the caller read (it holds the row lock, so this is a check), and
-- the transition's log row in the same statement.
WITH moved AS (
    UPDATE {schema}.{table}
    SET status = %(status)s::text,
        current_step = %(step)s,
        results = %(results)s,
        compensations = %(compensations)s,
        attempts = 1,
        deadline_at = CASE WHEN %(status)s::text IN ('running', 'compensating')
                           THEN {schema}.clock_now() + %(wait)s::interval END,
        completed_at = CASE WHEN %(status)s::text IN ('running', 'compensating') THEN NULL ELSE {schema}.clock_now() END,
        last_error = coalesce(%(last_error)s, last_error),
        version = version + 1,
        updated_at = {schema}.clock_now()
    WHERE saga_id = %(saga_id)s AND version = %(version)s
    RETURNING saga_id, {key} AS key, status, current_step, payload, results, compensations, attempts,
              step_timeout, deadline_at, started_at, updated_at, completed_at, last_error, version
), logged AS (
    INSERT INTO {schema}.{log} (saga_id, version, status, step, event, detail, at)
    SELECT saga_id, version, status, current_step, %(event)s, %(detail)s, {schema}.clock_now() FROM moved
)
SELECT * FROM moved

-- record_resend --
UPDATE {schema}.{table}
SET attempts = attempts + 1,
    deadline_at = {schema}.clock_now() + %(wait)s::interval,
    updated_at = {schema}.clock_now()
WHERE saga_id = %(saga_id)s AND version = %(version)s
RETURNING saga_id, {key} AS key, status, current_step, payload, results, compensations, attempts,
          step_timeout, deadline_at, started_at, updated_at, completed_at, last_error, version

-- count_sends --
-- How many times the saga sent the action of `step`: once when it entered the step, once
-- more for each of the watchdog's re-sends and each resume by an operator.
SELECT count(*)
FROM {schema}.{log}
WHERE saga_id = %(saga_id)s AND step = %(step)s AND status = 'running'
  AND event IN ('started', 'advanced', 'resent', 'resumed')

-- record_error --
-- The watchdog could not handle the saga (an error that is this saga's, not an outage):
-- say why on the row and in the log (an `error` entry: not a transition, the version
-- stays), and look again one step timeout later, so that the others are not held up by
-- it. Returns the errors in a row, this one included: the `error` entries logged since
-- the saga's last other entry (a transition or a re-send). The CTE's insert is not
-- visible to this statement's count, hence the 1 +.
WITH recorded AS (
    UPDATE {schema}.{table}
    SET last_error = %(error)s,
        deadline_at = {schema}.clock_now() + step_timeout,
        updated_at = {schema}.clock_now()
    WHERE saga_id = %(saga_id)s AND version = %(version)s
    RETURNING saga_id, version, status, current_step
), logged AS (
    INSERT INTO {schema}.{log} (saga_id, version, status, step, event, detail, at)
    SELECT saga_id, version, status, current_step, 'error', %(error)s, {schema}.clock_now() FROM recorded
)
SELECT 1 + (SELECT count(*)
            FROM {schema}.{log} AS l
            WHERE l.saga_id = r.saga_id AND l.event = 'error'
              AND l.id > coalesce((SELECT max(o.id) FROM {schema}.{log} AS o
                                   WHERE o.saga_id = r.saga_id AND o.event <> 'error'), 0)) AS errors
FROM recorded AS r

-- clear_error --
-- A late answer moves a saga the watchdog gave up on for want of replies: the error it gave
-- up with no longer describes it (its `gave_up` entry in the log keeps it).
UPDATE {schema}.{table} SET last_error = NULL
WHERE saga_id = %(saga_id)s AND version = %(version)s
RETURNING saga_id

-- insert_log --
INSERT INTO {schema}.{log} (saga_id, version, status, step, event, detail, at)
VALUES (%(saga_id)s, %(version)s, %(status)s, %(step)s, %(event)s, %(detail)s, {schema}.clock_now())

-- saga_log --
SELECT version, status, step, event, detail, at
FROM {schema}.{log}
WHERE saga_id = %(saga_id)s
ORDER BY id

-- list_sagas --
SELECT saga_id, {key} AS key, status, current_step, payload, results, compensations, attempts,
       step_timeout, deadline_at, started_at, updated_at, completed_at, last_error, version
FROM {schema}.{table}
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (NOT %(stuck)s OR (status IN ('running', 'compensating') AND deadline_at <= {schema}.clock_now()))
ORDER BY started_at DESC
LIMIT %(limit)s

-- sagas_of_key --
SELECT saga_id
FROM {schema}.{table}
WHERE {key} = %(key)s
ORDER BY started_at

-- count_by_status --
SELECT status, count(*) AS count
FROM {schema}.{table}
GROUP BY status
ORDER BY status

-- latency --
-- Seconds from start to end of the ended sagas among `ids`.
SELECT count(*) AS ended,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - started_at)) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - started_at)) AS p99,
       extract(epoch FROM max(completed_at) - min(started_at)) AS span
FROM {schema}.{table}
WHERE saga_id = ANY(%(ids)s::uuid[]) AND completed_at IS NOT NULL

-- requeue_command --
-- A re-sent command whose first copy is still in the outbox: put that row back in line
-- (it may have exhausted its publish attempts) instead of writing a second one.
UPDATE {schema}.outbox
SET status = 'pending', attempts = 0, available_at = {schema}.clock_now()
WHERE message_id = %(message_id)s
RETURNING id

-- find_dead_letter --
-- Why a participant parked a saga command (it will not answer that message id).
SELECT reason
FROM {schema}.dead_letters
WHERE consumer = %(consumer)s AND message_id = %(message_id)s
ORDER BY id DESC
LIMIT 1

-- count_ended --
-- Ended, or given up by the watchdog: at rest until a late answer or an operator moves it.
SELECT count(*)
FROM {schema}.{table}
WHERE saga_id = ANY(%(ids)s::uuid[]) AND status IN ('completed', 'compensated', 'failed', 'gave_up')

-- outcomes --
SELECT status, last_error
FROM {schema}.{table}
WHERE saga_id = ANY(%(ids)s::uuid[])

-- stalls --
-- Live sagas by how long each has been in its current state: since the first log entry of
-- its current version (a re-send is logged under the same version: it is not progress).
SELECT count(*) FILTER (WHERE entered <= {schema}.clock_now() - %(stuck_after)s::interval) AS stuck,
       coalesce(extract(epoch FROM {schema}.clock_now() - min(entered)), 0)::float8 AS longest_wait_seconds
FROM (
    SELECT coalesce((SELECT min(l.at) FROM {schema}.{log} AS l
                     WHERE l.saga_id = s.saga_id AND l.version = s.version), s.updated_at) AS entered
    FROM {schema}.{table} AS s
    WHERE s.status IN ('running', 'compensating')
) AS live

-- prune_log --
-- The transitions of sagas that completed or compensated longer than the retention ago,
-- a batch at a time, oldest log rows first (the primary key's order). Failed and given-up
-- sagas keep their log for the operator who will resume them; the saga rows themselves stay (an
-- idempotent placement finds its saga by key).
DELETE FROM {schema}.{log}
WHERE id IN (SELECT l.id FROM {schema}.{log} AS l
             WHERE l.at < {schema}.clock_now() - %(older_than)s::interval
               AND EXISTS (SELECT 1 FROM {schema}.{table} AS s
                           WHERE s.saga_id = l.saga_id
                             AND s.status IN ('completed', 'compensated')
                             AND s.completed_at < {schema}.clock_now() - %(older_than)s::interval)
             ORDER BY l.id
             LIMIT %(batch)s
             FOR UPDATE SKIP LOCKED)

-- count_prunable_log --
SELECT count(*) FROM {schema}.{log} AS l
WHERE l.at < {schema}.clock_now() - %(older_than)s::interval
  AND EXISTS (SELECT 1 FROM {schema}.{table} AS s
              WHERE s.saga_id = l.saga_id
                AND s.status IN ('completed', 'compensated')
                AND s.completed_at < {schema}.clock_now() - %(older_than)s::interval)
