-- Named queries, parsed once by sql/queries.py. `{schema}` is the service's schema,
-- substituted as an identifier (never as text); everything else is a named parameter.

-- insert_outbox --
-- The row, and the NOTIFY that wakes the relays at commit, in one statement; none when the
-- transaction or session set estafeta.wakeup to 'poll' or 'after-commit' (estafeta/messaging/wakeups.py).
WITH inserted AS (
    INSERT INTO {schema}.outbox
        (message_id, queue_name, actor_name, message, ordering_key, saga_id, available_at, message_type)
    VALUES
        (%(message_id)s, %(queue_name)s, %(actor_name)s, %(message)s, %(ordering_key)s, %(saga_id)s,
         coalesce(%(at)s::timestamptz, {schema}.clock_now() + %(delay)s::interval), %(message_type)s)
    RETURNING id
)
SELECT pg_notify(%(channel)s, %(schema_name)s) FROM inserted
WHERE coalesce(current_setting('estafeta.wakeup', true), '') NOT IN ('poll', 'after-commit')

-- insert_outbox_handoff --
-- insert_outbox for a row a step hands straight to the next step (estafeta/messaging/handoff.py):
-- leased, attempts -1 and due only when the lease ends, so no relay claims it meanwhile
-- (the next step's transaction deletes it, claim_handoff) and, not being a delayed row,
-- it holds back its key's later rows. A worker killed first leaves it to the relays once
-- the lease ends; a hand-off that fails releases it at once (release_handoff). No NOTIFY.
INSERT INTO {schema}.outbox
    (message_id, queue_name, actor_name, message, ordering_key, saga_id, available_at, message_type, attempts)
VALUES
    (%(message_id)s, %(queue_name)s, %(actor_name)s, %(message)s, %(ordering_key)s, %(saga_id)s,
     {schema}.clock_now() + %(lease)s::interval, %(message_type)s, -1)

-- claim_heads --
-- The oldest due rows that head their key (no older row of the same key is left, other
-- than a delayed one that was never attempted), skipping rows another relay holds.
-- Holding a key's head row is what gives a relay that key: another relay cannot claim
-- the head while it is locked, and the key's later rows are not heads while it exists.
-- A key whose head failed or waits for a retry has no head: only that key stops.
-- Only the first %(window)s due rows are looked at: the plan is then an index scan in id
-- order whatever the statistics say (a freshly filled outbox has none, and the planner
-- would otherwise check every pending row, every batch); claim_heads_past_window finds the
-- heads a window full of a blocked key's rows hides. A row heads its key when it is the
-- key's first row that counts: one probe of the (ordering_key, id) index, which the planner
-- memoizes per key (a window full of one key's rows costs one probe, not 2,000). Here and
-- below a key's rows are asked for as a range of (ordering_key, id) pairs, never as
-- "ordering_key = ...": a key that holds most rows (the blocked one) would otherwise make
-- the planner walk the whole outbox in id order to find another key's first row.
SELECT o.id, o.message_id, o.queue_name, o.actor_name, o.message, o.ordering_key, o.saga_id, o.created_at,
       o.attempts, extract(epoch FROM clock_timestamp() - o.created_at)::float8 AS age_seconds
FROM (SELECT id FROM {schema}.outbox
      WHERE status = 'pending' AND available_at <= {schema}.clock_now()
      ORDER BY id
      LIMIT %(window)s) AS due
JOIN {schema}.outbox AS o ON o.id = due.id
LEFT JOIN LATERAL (
    SELECT first.id FROM {schema}.outbox AS first
    WHERE first.ordering_key IS NOT NULL
      AND (first.ordering_key, first.id) >= (o.ordering_key, 0)
      AND (first.ordering_key, first.id) <= (o.ordering_key, 9223372036854775807)
      AND NOT (first.status = 'pending' AND first.attempts = 0 AND first.available_at > {schema}.clock_now())
    ORDER BY first.ordering_key, first.id
    LIMIT 1) AS first ON true
WHERE o.status = 'pending'
  AND o.available_at <= {schema}.clock_now()
  AND (o.ordering_key IS NULL OR o.id = first.id)
ORDER BY o.id
LIMIT %(limit)s
FOR UPDATE OF o SKIP LOCKED

-- claim_followers --
-- More due rows of the keys whose heads this relay holds, in id order, each key's rows up
-- to its first row that failed or waits for a retry: one busy key fills a batch instead of
-- going out one row per round trip. Each key is read on its own stretch of the
-- (ordering_key, id) index, and its first refused row found on outbox_refused, so no other
-- key's rows (blocked or not) are ever read. The candidates are sorted, never found by
-- walking the outbox in id order: the caller turns sorting back on for this query.
SELECT o.id, o.message_id, o.queue_name, o.actor_name, o.message, o.ordering_key, o.saga_id, o.created_at,
       o.attempts, extract(epoch FROM clock_timestamp() - o.created_at)::float8 AS age_seconds
FROM unnest(%(keys)s::text[]) AS k(ordering_key)
CROSS JOIN LATERAL (
    SELECT f.id FROM {schema}.outbox AS f
    WHERE f.ordering_key IS NOT NULL
      AND (f.ordering_key, f.id) > (k.ordering_key, 0)
      AND (f.ordering_key, f.id) < (k.ordering_key,
            coalesce((SELECT b.id FROM {schema}.outbox AS b
                      WHERE b.ordering_key = k.ordering_key
                        AND (b.attempts <> 0 OR b.status = 'failed')
                        AND (b.status = 'failed' OR b.available_at > {schema}.clock_now())
                      ORDER BY b.ordering_key, b.id
                      LIMIT 1), 9223372036854775807))
      AND f.id <> ALL(%(heads)s::bigint[])
      AND f.status = 'pending'
      AND f.available_at <= {schema}.clock_now()
    ORDER BY f.ordering_key, f.id
    LIMIT %(limit)s) AS follower
JOIN {schema}.outbox AS o ON o.id = follower.id
WHERE o.status = 'pending'
  AND o.available_at <= {schema}.clock_now()
ORDER BY o.id
LIMIT %(limit)s
FOR UPDATE OF o SKIP LOCKED

-- claim_heads_past_window --
-- The heads claim_heads misses when its window is full of rows that cannot go now (a
-- blocked key's backlog): the head of every key, found by a walk over the distinct keys of
-- the (ordering_key, id) index (a loose index scan: one probe per key, never one per row),
-- and the oldest keyless rows from their own index. A key's head is its oldest row other
-- than a delayed one never attempted; a key whose head failed, waits for a retry or is held
-- by another relay gives nothing. %(claimed)s are the rows this transaction holds already.
WITH RECURSIVE keys (ordering_key) AS (
    (SELECT ordering_key FROM {schema}.outbox
     WHERE ordering_key IS NOT NULL
     ORDER BY ordering_key
     LIMIT 1)
    UNION ALL
    SELECT (SELECT next.ordering_key FROM {schema}.outbox AS next
            WHERE next.ordering_key > keys.ordering_key
            ORDER BY next.ordering_key
            LIMIT 1)
    FROM keys
    WHERE keys.ordering_key IS NOT NULL
), candidates (id) AS (
    SELECT head.id
    FROM keys
    CROSS JOIN LATERAL (
        SELECT h.id, h.status, h.available_at FROM {schema}.outbox AS h
        WHERE h.ordering_key IS NOT NULL
          AND (h.ordering_key, h.id) >= (keys.ordering_key, 0)
          AND (h.ordering_key, h.id) <= (keys.ordering_key, 9223372036854775807)
          AND NOT (h.status = 'pending' AND h.attempts = 0 AND h.available_at > {schema}.clock_now())
        ORDER BY h.ordering_key, h.id
        LIMIT 1) AS head
    WHERE head.status = 'pending' AND head.available_at <= {schema}.clock_now()
    UNION ALL
    (SELECT id FROM {schema}.outbox
     WHERE status = 'pending' AND ordering_key IS NULL AND available_at <= {schema}.clock_now()
       AND id <> ALL(%(claimed)s::bigint[])
     ORDER BY id
     LIMIT %(limit)s)
)
SELECT o.id, o.message_id, o.queue_name, o.actor_name, o.message, o.ordering_key, o.saga_id, o.created_at,
       o.attempts, extract(epoch FROM clock_timestamp() - o.created_at)::float8 AS age_seconds
FROM candidates
JOIN {schema}.outbox AS o ON o.id = candidates.id
WHERE o.status = 'pending'
  AND o.available_at <= {schema}.clock_now()
  AND o.id <> ALL(%(claimed)s::bigint[])
ORDER BY o.id
LIMIT %(limit)s
FOR UPDATE OF o SKIP LOCKED

-- due_in_window --
-- How many rows are due, counting at most %(window)s: as many means claim_heads saw only
-- part of them.
SELECT count(*)
FROM (SELECT 1 FROM {schema}.outbox
      WHERE status = 'pending' AND available_at <= {schema}.clock_now()
      ORDER BY id
      LIMIT %(window)s) AS due

-- held_back --
-- Claimed rows that must wait after all: an older row of the same key exists outside the
-- batch (another relay holds it; a transaction that overlapped ours committed it late).
-- Publishing them now would overtake it. Delayed rows never attempted do not count: a
-- delayed row takes its place in its key's order when it becomes due. Per key, the first
-- row that counts outside the batch: the batch's rows of that key past it wait. One walk
-- of each key's (ordering_key, id) range, through its rows in the batch, never one per row.
WITH claimed (id, ordering_key) AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(keys)s::text[])
), gaps (ordering_key, id) AS (
    SELECT k.ordering_key, gap.id
    FROM (SELECT ordering_key, max(id) AS last FROM claimed WHERE ordering_key IS NOT NULL GROUP BY ordering_key) AS k
    CROSS JOIN LATERAL (
        SELECT older.id FROM {schema}.outbox AS older
        WHERE older.ordering_key IS NOT NULL
          AND (older.ordering_key, older.id) >= (k.ordering_key, 0)
          AND (older.ordering_key, older.id) < (k.ordering_key, k.last)
          AND older.id <> ALL(%(batch)s::bigint[])
          AND NOT (older.status = 'pending' AND older.attempts = 0 AND older.available_at > {schema}.clock_now())
        ORDER BY older.ordering_key, older.id
        LIMIT 1) AS gap
)
SELECT claimed.id
FROM claimed
JOIN gaps ON gaps.ordering_key = claimed.ordering_key
WHERE gaps.id < claimed.id

-- delete_published --
DELETE FROM {schema}.outbox WHERE id = ANY(%(ids)s::bigint[])

-- list_scheduled --
-- Rows sent with a delay or for a time (send(..., delay=/at=)) that is not here yet, soonest first.
SELECT message_id, id, queue_name, actor_name, message_type, ordering_key, saga_id, created_at, available_at
FROM {schema}.outbox
WHERE status = 'pending' AND attempts = 0 AND available_at > {schema}.clock_now()
ORDER BY available_at, id
LIMIT %(limit)s

-- cancel_outbox --
-- Delete the row unless a relay holds it: a relay's claim locks the rows it publishes
-- (FOR UPDATE SKIP LOCKED) until it deletes them after the broker's confirm, so SKIP
-- LOCKED here makes exactly one of the two win, and never waits or aborts the caller's
-- transaction. While this transaction holds the row, relays skip it.
DELETE FROM {schema}.outbox
WHERE id = (SELECT id FROM {schema}.outbox WHERE message_id = %(message_id)s FOR UPDATE SKIP LOCKED)
RETURNING id

-- claim_handoff --
-- The row a step hands to the next step in its worker thread (estafeta/messaging/handoff.py), deleted
-- in that step's transaction, which holds it until it ends: relays skip it (SKIP LOCKED, as
-- for cancel_outbox), and its key's later rows are not heads while it exists. Only a leased
-- row (insert_outbox_handoff) or a due one never attempted, that no relay holds and no older
-- row of its key precedes: exactly one of the hand-off and a relay sends it, in its key's
-- order. No row: a relay has it (its lease ended), or it waits behind its key.
DELETE FROM {schema}.outbox AS r
WHERE r.id = (SELECT id FROM {schema}.outbox
              WHERE message_id = %(message_id)s AND status = 'pending'
                AND (attempts = -1 OR (attempts = 0 AND available_at <= {schema}.clock_now()))
              FOR UPDATE SKIP LOCKED)
  AND NOT EXISTS (SELECT 1 FROM {schema}.outbox AS older
                  WHERE r.ordering_key IS NOT NULL
                    AND (older.ordering_key, older.id) >= (r.ordering_key, 0)
                    AND (older.ordering_key, older.id) < (r.ordering_key, r.id))
RETURNING r.id

-- release_handoff --
-- A hand-off's row back to the relays, due now (the hand-off failed, or waits behind its key).
-- A row a relay holds (its lease ended) is the relay's already: skipped, never waited for.
UPDATE {schema}.outbox SET attempts = 0, available_at = {schema}.clock_now()
WHERE id = (SELECT id FROM {schema}.outbox
            WHERE message_id = %(message_id)s AND status = 'pending' AND attempts = -1
            FOR UPDATE SKIP LOCKED)

-- reschedule_outbox --
-- Move a pending row to %(at)s unless a relay holds it (see cancel_outbox), and wake the
-- relays at commit: one sleeping until the old time would miss an earlier one.
WITH moved AS (
    UPDATE {schema}.outbox
    SET available_at = %(at)s::timestamptz
    WHERE id = (SELECT id FROM {schema}.outbox
                WHERE message_id = %(message_id)s AND status = 'pending'
                FOR UPDATE SKIP LOCKED)
    RETURNING id
)
SELECT id, pg_notify(%(channel)s, %(schema_name)s) FROM moved

-- outbox_row_status --
-- Why a cancel or reschedule found nothing to change: the row's status if it is still
-- there (a relay holds it, or it failed), no row if it was published or never existed.
SELECT status FROM {schema}.outbox WHERE message_id = %(message_id)s

-- record_publish_failure --
-- A NULL max_attempts never parks the row: the broker turned it away for now, and the
-- attempt is a deferral. Only refusals (attempts - deferrals) count toward parking. A
-- hand-off's leased row (attempts -1, insert_outbox_handoff) was never attempted.
UPDATE {schema}.outbox
SET attempts = greatest(attempts, 0) + 1,
    deferrals = deferrals + (%(max_attempts)s::int IS NULL)::int,
    last_error = %(error)s,
    status = CASE WHEN greatest(attempts, 0) + 1 - deferrals >= %(max_attempts)s::int THEN 'failed' ELSE 'pending' END,
    available_at = {schema}.clock_now() + %(backoff)s::interval
WHERE id = ANY(%(ids)s::bigint[])

-- due_probe --
-- A polling relay's question before it claims: is any pending row due now, and if none is,
-- in how many seconds does the next one fall due (NULL: none)? Claiming from an outbox with
-- nothing due costs a transaction and two round trips; this costs one statement, pipelined
-- with the other outboxes' of the same database. A row due now (claimable or not: a key
-- held back by its head still counts) sends the relay to claim, as it always did.
SELECT due.any_due,
       CASE WHEN NOT due.any_due THEN
           (SELECT extract(epoch FROM min(available_at) - {schema}.clock_now())::float8
            FROM {schema}.outbox
            WHERE status = 'pending' AND available_at > {schema}.clock_now())
       END
FROM (SELECT EXISTS (SELECT 1 FROM {schema}.outbox
                     WHERE status = 'pending' AND available_at <= {schema}.clock_now()) AS any_due) AS due

-- next_due --
-- Seconds until the next pending row that is not due yet becomes due (NULL: none).
SELECT extract(epoch FROM min(available_at) - {schema}.clock_now())::float8
FROM {schema}.outbox
WHERE status = 'pending' AND available_at > {schema}.clock_now()

-- retry_failed --
UPDATE {schema}.outbox
SET status = 'pending', attempts = 0, deferrals = 0, available_at = {schema}.clock_now()
WHERE status = 'failed' AND (%(id)s::bigint IS NULL OR id = %(id)s::bigint)
RETURNING id

-- list_failed --
SELECT id, message_id, queue_name, actor_name, ordering_key, attempts, last_error, created_at, message
FROM {schema}.outbox
WHERE status = 'failed' AND (%(id)s::bigint IS NULL OR id = %(id)s::bigint)
ORDER BY id
LIMIT %(limit)s

-- outbox_stats --
-- "Waiting since": a row never attempted waits from when it became due (its delay
-- over); a row being retried waits from its creation, so a stuck row keeps ageing.
SELECT count(*) FILTER (WHERE status = 'pending') AS pending,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       count(*) FILTER (WHERE status = 'pending' AND attempts > 0) AS retrying,
       count(*) FILTER (WHERE status = 'pending' AND attempts = 0 AND available_at > {schema}.clock_now()) AS delayed,
       count(DISTINCT ordering_key) FILTER (WHERE status = 'failed') AS blocked_keys,
       coalesce(extract(epoch FROM {schema}.clock_now() - min(CASE WHEN attempts = 0 THEN available_at ELSE created_at END)
                FILTER (WHERE status = 'pending' AND (attempts > 0 OR available_at <= {schema}.clock_now()))), 0)::float8
           AS oldest_pending_age_seconds,
       (SELECT last_error FROM {schema}.outbox
        WHERE last_error IS NOT NULL ORDER BY id LIMIT 1) AS oldest_error
FROM {schema}.outbox

-- outbox_stats_by_type --
-- outbox_stats per message type (NULL: rows written before the type was recorded), the
-- types with the most waiting first. "Oldest" is when the oldest row of the type was written.
SELECT message_type,
       count(*) FILTER (WHERE status = 'pending') AS pending,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       min(created_at) AS oldest_created_at
FROM {schema}.outbox
GROUP BY message_type
ORDER BY count(*) DESC, message_type NULLS LAST

-- record_inbox --
INSERT INTO {schema}.inbox (consumer, message_id)
VALUES (%(consumer)s, %(message_id)s)
ON CONFLICT DO NOTHING

-- count_attempt --
-- One more delivery of a message, counted before its work, in a transaction of its own.
-- That transaction commits with synchronous_commit = off (local to it): the count needs no
-- WAL flush of its own, because losing the last counts in a database crash only delays
-- parking a message that keeps killing its worker by a few deliveries; the step's own
-- transaction, which acknowledges nothing until it is durable, is never made asynchronous.
-- A delivery of the same message still in its transaction has deleted the count row
-- (record_inbox_*): this insert waits for it to end, then finds it committed (this copy is
-- a duplicate) or rolled back. lock_timeout bounds that wait; a copy that gives up has
-- counted nothing (the volatile subquery is evaluated before the insert can wait).
-- Unless %(alone)s, a delivery beyond the copies Dramatiq sent (%(copies)s: its retries + 1)
-- is not counted and no row comes back: an earlier delivery died unfinished, and this one
-- is a suspect, counted when it runs alone in its process (estafeta.steps.delivery._beside_or_alone), so that
-- a message in flight beside the one that killed the process is not blamed for the kill.
-- The delivery counted is unfinished until it commits (the row is deleted) or its step
-- raises (end_attempt): if the previous one still is, it died with its process, and deaths
-- counts it. %(deaths_before)s: deaths no row recorded (1 for a RabbitMQ redelivery whose
-- first delivery went uncounted: it ended without an acknowledgement).
INSERT INTO {schema}.inbox_attempts (consumer, message_id, unfinished, deaths)
SELECT %(consumer)s, %(message_id)s, true, %(deaths_before)s::int
FROM (SELECT set_config('synchronous_commit', 'off', true),
             set_config('lock_timeout', %(lock_timeout)s, true)) AS asynchronous_commit
ON CONFLICT (consumer, message_id)
    DO UPDATE SET attempts = inbox_attempts.attempts + 1, last_attempt_at = {schema}.clock_now(),
                  deaths = inbox_attempts.deaths + inbox_attempts.unfinished::int, unfinished = true
    WHERE %(alone)s::boolean OR inbox_attempts.attempts < %(copies)s::int
RETURNING attempts, deaths

-- end_attempt --
-- The counted delivery of a message ended without committing (its step raised and its
-- transaction rolled back): it did not die with its process. Committed asynchronously, as
-- the count is: losing it in a database crash counts one death too many. A row another
-- delivery's transaction holds is skipped, never waited for: that delivery is in flight
-- (this one gave up waiting for it, counting nothing) and ends its own count.
UPDATE {schema}.inbox_attempts SET unfinished = false
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS asynchronous_commit
WHERE (consumer, message_id) IN (
    SELECT consumer, message_id FROM {schema}.inbox_attempts
    WHERE consumer = %(consumer)s AND message_id = %(message_id)s
    FOR UPDATE SKIP LOCKED)

-- record_inbox_forgetting_attempts --
-- The step's inbox record, and its delivery count dropped in the same statement: both
-- commit with the step's work, or neither (a rolled-back delivery keeps its count).
-- Here and in the next two, the transaction's wake-up policy is set first
-- (estafeta.messaging.wakeups: %(wakeup)s is 'after-commit', or NULL to leave the session's): one
-- statement fewer in the step's first pipeline.
WITH settings AS MATERIALIZED (
    SELECT set_config('estafeta.wakeup', coalesce(%(wakeup)s::text, current_setting('estafeta.wakeup', true), ''), true)
),
forgotten AS (
    DELETE FROM {schema}.inbox_attempts WHERE consumer = %(consumer)s AND message_id = %(message_id)s
)
INSERT INTO {schema}.inbox (consumer, message_id)
SELECT %(consumer)s, %(message_id)s FROM settings
ON CONFLICT DO NOTHING

-- record_inbox_first_delivery --
-- record_inbox_forgetting_attempts for a delivery that was not counted (a first delivery
-- on RabbitMQ, see estafeta.steps.delivery._uncounted): the count's statement was what waited for a
-- delivery of the same message still in flight, at most lock_timeout, so this one does:
-- lock_timeout is set for the insert only, and set back once it has its row (a row comes
-- back for a new message, none for a duplicate, whose transaction ends at once).
WITH settings AS MATERIALIZED (
    SELECT current_setting('lock_timeout') AS previous, set_config('lock_timeout', %(lock_timeout)s, true),
           set_config('estafeta.wakeup', coalesce(%(wakeup)s::text, current_setting('estafeta.wakeup', true), ''), true)
),
forgotten AS (
    DELETE FROM {schema}.inbox_attempts WHERE consumer = %(consumer)s AND message_id = %(message_id)s
),
recorded AS (
    INSERT INTO {schema}.inbox (consumer, message_id)
    SELECT %(consumer)s, %(message_id)s FROM settings
    ON CONFLICT DO NOTHING
    RETURNING message_id
)
SELECT set_config('lock_timeout', settings.previous, true) FROM settings, recorded

-- record_inbox_and_lock --
-- record_inbox_forgetting_attempts, and the step's PostgreSQL lock taken for a first
-- delivery only, in one statement: a row comes back if the message is new (and the lock
-- is then held), none for a duplicate, which takes no lock and never waits for whoever
-- holds the key. lock_timeout is set first (a materialized CTE the insert reads): it
-- bounds the wait on a delivery of the same message still in flight (its uncommitted
-- inbox row) and then the lock's, and stays set for the step's own row locks. The lock is
-- PostgresLocks.statement's (estafeta/locks/step_locks.py): the same hash of the same key.
WITH settings AS MATERIALIZED (
    SELECT set_config('lock_timeout', %(lock_timeout)s, true),
           set_config('estafeta.wakeup', coalesce(%(wakeup)s::text, current_setting('estafeta.wakeup', true), ''), true)
),
forgotten AS (
    DELETE FROM {schema}.inbox_attempts WHERE consumer = %(consumer)s AND message_id = %(message_id)s
),
recorded AS (
    INSERT INTO {schema}.inbox (consumer, message_id)
    SELECT %(consumer)s, %(message_id)s FROM settings
    ON CONFLICT DO NOTHING
    RETURNING message_id
)
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0)) FROM recorded

-- forget_attempts --
DELETE FROM {schema}.inbox_attempts WHERE consumer = %(consumer)s AND message_id = %(message_id)s

-- insert_dead_letter --
INSERT INTO {schema}.dead_letters (consumer, message_id, message, reason)
VALUES (%(consumer)s, %(message_id)s, %(message)s, %(reason)s)

-- list_dead_letters --
SELECT id, consumer, message_id, message, reason, created_at
FROM {schema}.dead_letters
ORDER BY id DESC
LIMIT %(limit)s

-- count_dead_letters --
-- Dead letters still waiting for an operator (replayed and obsolete ones are resolved).
SELECT count(*) FROM {schema}.dead_letters WHERE status = 'parked'

-- search_dead_letters --
-- Newest first; all, or those in one status.
SELECT id, consumer, message_id, message, reason, created_at, status, resolved_at, replayed_as, note
FROM {schema}.dead_letters
WHERE %(status)s::text IS NULL OR status = %(status)s::text
ORDER BY id DESC
LIMIT %(limit)s

-- dead_letter_causes --
-- What grouping needs of the parked dead letters: no payloads.
SELECT id, consumer, reason, created_at
FROM {schema}.dead_letters
WHERE status = 'parked'
ORDER BY id

-- get_dead_letters --
SELECT id, consumer, message_id, message, reason, created_at, status, resolved_at, replayed_as, note
FROM {schema}.dead_letters
WHERE id = ANY(%(ids)s::bigint[])
ORDER BY id

-- lock_dead_letter --
-- A replay holds the dead letter until its transaction ends: a second replay waits, then
-- finds it resolved.
SELECT id, consumer, message_id, message, reason, created_at, status, resolved_at, replayed_as, note
FROM {schema}.dead_letters
WHERE id = %(id)s
FOR UPDATE

-- resolve_dead_letter --
UPDATE {schema}.dead_letters
SET status = %(status)s, resolved_at = {schema}.clock_now(), replayed_as = %(replayed_as)s, note = %(note)s
WHERE id = %(id)s AND status = 'parked'

-- prune_inbox --
-- Inbox records older than the retention, a batch at a time, in a short transaction of
-- their own, skipping rows a delivery holds (never waiting on one). The record of a
-- message that is still in the dead letters stays as long as its dead letter: it keeps a
-- late copy of the parked message from running beside the message's replay.
DELETE FROM {schema}.inbox AS i
USING (SELECT consumer, message_id FROM {schema}.inbox AS o
       WHERE processed_at < {schema}.clock_now() - %(older_than)s::interval
         AND NOT EXISTS (SELECT 1 FROM {schema}.dead_letters AS d
                         WHERE d.consumer = o.consumer AND d.message_id = o.message_id::text)
       LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED) AS old
WHERE i.consumer = old.consumer AND i.message_id = old.message_id

-- count_prunable_inbox --
SELECT count(*) FROM {schema}.inbox AS o
WHERE processed_at < {schema}.clock_now() - %(older_than)s::interval
  AND NOT EXISTS (SELECT 1 FROM {schema}.dead_letters AS d
                  WHERE d.consumer = o.consumer AND d.message_id = o.message_id::text)

-- prune_inbox_attempts --
-- Delivery counts of messages that never reached an outcome here (lost elsewhere): they
-- only ever park a message that keeps killing its worker, which a week-old count is not.
DELETE FROM {schema}.inbox_attempts AS a
USING (SELECT consumer, message_id FROM {schema}.inbox_attempts
       WHERE last_attempt_at < {schema}.clock_now() - %(older_than)s::interval
       LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED) AS old
WHERE a.consumer = old.consumer AND a.message_id = old.message_id

-- count_prunable_inbox_attempts --
SELECT count(*) FROM {schema}.inbox_attempts WHERE last_attempt_at < {schema}.clock_now() - %(older_than)s::interval

-- prune_dead_letters --
DELETE FROM {schema}.dead_letters
WHERE id IN (SELECT id FROM {schema}.dead_letters
             WHERE created_at < {schema}.clock_now() - %(older_than)s::interval
             ORDER BY id
             LIMIT %(batch)s
             FOR UPDATE SKIP LOCKED)

-- count_prunable_dead_letters --
SELECT count(*) FROM {schema}.dead_letters WHERE created_at < {schema}.clock_now() - %(older_than)s::interval

-- advance_fence --
-- Record a freshly acquired lock's token as the newest for its key; no row comes back if
-- an equal or newer token is already recorded (the acquisition is stale before it began).
-- Run in autocommit: one statement, one round trip. The CTE sets, for this statement's
-- own transaction, lock_timeout (before the insert can wait on a checked holder's row
-- lock) and synchronous_commit = off: the row needs no durability of its own, because a
-- crash aborts every guarded transaction in flight and a guarded commit flushes the WAL
-- past it anyway; visibility to other sessions is immediate either way.
WITH settings AS MATERIALIZED (
    SELECT set_config('lock_timeout', %(lock_timeout)s, true),
           set_config('synchronous_commit', 'off', true))
INSERT INTO {schema}.fences (lock_key, token)
SELECT %(key)s, %(token)s FROM settings
ON CONFLICT (lock_key) DO UPDATE
    SET token = EXCLUDED.token, raised_at = {schema}.clock_now()
    WHERE fences.token < EXCLUDED.token
RETURNING token

-- read_fence --
SELECT token FROM {schema}.fences WHERE lock_key = %(key)s

-- check_fence --
-- The last statement of a guarded transaction. FOR SHARE makes a successor's
-- advance_fence wait until this transaction has ended, so no newer holder can start
-- reading between this check and the commit. The row lock is taken above the join, so
-- lock_timeout is set before it can wait (it may queue behind a waiting advance).
WITH settings AS MATERIALIZED (SELECT set_config('lock_timeout', %(lock_timeout)s, true))
SELECT f.token FROM settings, {schema}.fences AS f WHERE f.lock_key = %(key)s FOR SHARE OF f

-- prune_fences --
-- Tokens of keys nobody locked for the retention, a batch at a time. SKIP LOCKED: a row a
-- guarded transaction checked (FOR SHARE, until its commit) is left for the next run;
-- pruning never holds a step up. Always safe: see sql/fences.py.
DELETE FROM {schema}.fences
WHERE lock_key IN (SELECT lock_key FROM {schema}.fences
                   WHERE raised_at < {schema}.clock_now() - %(older_than)s::interval
                   LIMIT %(batch)s
                   FOR UPDATE SKIP LOCKED)

-- count_prunable_fences --
SELECT count(*) FROM {schema}.fences WHERE raised_at < {schema}.clock_now() - %(older_than)s::interval

-- current_wal_position --
-- How far the WAL is flushed now: past the commit record of every transaction the caller
-- has seen (with synchronous_commit on, the default, a commit is flushed before anyone can
-- see it). Not the insert position: the caller's own uncommitted WAL (its row locks) may
-- not be flushed, and so not sent to any standby, until it commits.
SELECT pg_current_wal_flush_lsn()::text

-- standbys_flushed_to --
-- Standbys that have flushed the WAL up to %(target)s (a promotion replays what they
-- flushed), and those whose position this user may not see (it takes pg_monitor).
SELECT count(*) FILTER (WHERE flush_lsn >= %(target)s::pg_lsn),
       count(*) FILTER (WHERE flush_lsn IS NULL)
  FROM pg_stat_replication

-- clock_now --
-- The schema's time, as every decision reads it (see migrations/_common/0007_clock.sql).
SELECT {schema}.clock_now()

-- ask_for_test_clock --
-- This transaction moves the schema's clock: without it, the clock table's trigger refuses
-- the write (migrations/_common/0012_clock_test_only.sql).
SELECT set_config('estafeta.test_clock', 'on', true)

-- read_clock --
-- The clock table's row: none in production (clock_now() is PostgreSQL's now()).
SELECT skew, stopped_at FROM {schema}.clock

-- move_clock --
-- Put the schema's time at %(at)s: a stopped clock stays there; a running one's skew becomes
-- the distance from PostgreSQL's now(). Tests only (estafeta.testing); a production
-- schema's clock table stays empty.
INSERT INTO {schema}.clock AS c (skew) VALUES (%(at)s::timestamptz - now())
ON CONFLICT (only_row) DO UPDATE
SET skew = EXCLUDED.skew,
    stopped_at = CASE WHEN c.stopped_at IS NULL THEN NULL ELSE %(at)s::timestamptz END

-- advance_clock --
-- Move the schema's time forward by %(by)s, exactly (whatever time passed since it was read);
-- a stopped clock stays stopped (NULL + interval is NULL: a running one stays running).
INSERT INTO {schema}.clock AS c (skew) VALUES (%(by)s::interval)
ON CONFLICT (only_row) DO UPDATE
SET skew = c.skew + EXCLUDED.skew, stopped_at = c.stopped_at + EXCLUDED.skew

-- stop_clock --
-- Stop the schema's time at %(at)s: it reads %(at)s until moved.
INSERT INTO {schema}.clock AS c (stopped_at) VALUES (%(at)s::timestamptz)
ON CONFLICT (only_row) DO UPDATE SET stopped_at = EXCLUDED.stopped_at

-- reset_clock --
DELETE FROM {schema}.clock
