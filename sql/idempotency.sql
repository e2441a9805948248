-- Named queries of the Idempotency-Key store, parsed once by sql/idempotency.py. `{schema}` is
-- the schema of the service whose transactions the records join, bound as an identifier.

-- try_lock_key --
-- Whoever holds this transaction-scoped lock is handling the key now; another request with
-- the key is told so at once (409) instead of waiting. The lock dies with the transaction,
-- so a killed server frees the key as soon as PostgreSQL notices the dropped connection.
SELECT pg_try_advisory_xact_lock(hashtextextended(%(lock_name)s, 0))

-- find_key --
-- Read after the lock is held: every earlier holder's transaction has ended by then.
SELECT fingerprint, status, headers, body
FROM {schema}.idempotency_keys
WHERE client = %(client)s AND key = %(key)s AND expires_at > now()

-- store_key --
-- An expired record of the same key is replaced; an unexpired one is never overwritten
-- (no row comes back).
INSERT INTO {schema}.idempotency_keys
    (client, key, fingerprint, method, target, status, headers, body, expires_at)
VALUES
    (%(client)s, %(key)s, %(fingerprint)s, %(method)s, %(target)s, %(status)s, %(headers)s, %(body)s,
     now() + %(ttl)s::interval)
ON CONFLICT (client, key) DO UPDATE
    SET fingerprint = EXCLUDED.fingerprint,
        method = EXCLUDED.method,
        target = EXCLUDED.target,
        status = EXCLUDED.status,
        headers = EXCLUDED.headers,
        body = EXCLUDED.body,
        created_at = now(),
        expires_at = EXCLUDED.expires_at
    WHERE idempotency_keys.expires_at <= now()
RETURNING 1

-- prune_keys --
-- One batch of expired records, oldest first; rows another transaction holds (a request
-- replacing its expired record) are left for the next pass.
DELETE FROM {schema}.idempotency_keys
WHERE (client, key) IN (
    SELECT client, key FROM {schema}.idempotency_keys
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED)
