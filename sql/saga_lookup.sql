-- Named queries that look sagas up as an operator does, parsed once by sql/saga_lookup.py.
-- `{schema}`, `{table}` and `{key}` are bound as identifiers, as in sagas.sql.

-- sagas_in_id_range --
-- The sagas whose id lies between two ids: an id typed whole (low = high) or a prefix of one
-- (low and high padded with 0 and f), on the primary key's index.
SELECT saga_id, {key} AS key, status, current_step, payload, results, compensations, attempts,
       step_timeout, deadline_at, started_at, updated_at, completed_at, last_error, version
FROM {schema}.{table}
WHERE saga_id BETWEEN %(low)s AND %(high)s
ORDER BY saga_id
LIMIT %(limit)s

-- sagas_of_key_value --
-- The sagas of one business key (an order id), newest first, on the key's index.
SELECT saga_id, {key} AS key, status, current_step, payload, results, compensations, attempts,
       step_timeout, deadline_at, started_at, updated_at, completed_at, last_error, version
FROM {schema}.{table}
WHERE {key} = %(key)s
ORDER BY started_at DESC
LIMIT %(limit)s

-- sagas_in_key_range --
-- The sagas whose uuid key lies between two values (a prefix of the key), on the key's index.
SELECT saga_id, {key} AS key, status, current_step, payload, results, compensations, attempts,
       step_timeout, deadline_at, started_at, updated_at, completed_at, last_error, version
FROM {schema}.{table}
WHERE {key} BETWEEN %(low)s AND %(high)s
ORDER BY {key}
LIMIT %(limit)s

-- standing_by_step --
-- Where the sagas that have not ended well stand now: live ones (each waits on its current
-- step, an action or an undo) and failed ones (stopped there), by status and step.
SELECT status, current_step, compensations IS NOT NULL AS compensating, count(*) AS count
FROM {schema}.{table}
WHERE status IN ('running', 'compensating', 'failed')
GROUP BY status, current_step, compensations IS NOT NULL
