-- Named queries of the Idempotency-Key store, parsed once by sql/idempotency.py. `{schema}` is
-- the schema of the service whose transactions the records join, bound as an identifier.

-- claim_key --
-- The key's unexpired record if one is visible (its answer is final: nobody changes an
-- unexpired record); otherwise whether this transaction got the key's lock, which is held
-- by whoever handles the key now (another request is told so at once: 409). The lock is
-- transaction-scoped, so a killed server frees the key when PostgreSQL drops its session.
-- One round trip: the record is read with this statement's snapshot, taken before the
-- lock, so a holder that committed in between is missed here; store_key then finds its
-- record and the caller starts over, as it does when the handler fails (on that holder's
-- writes, a unique key it took first) and the record is there afterwards.
SELECT k.fingerprint, k.status, k.headers, k.body,
       CASE WHEN k.key IS NULL THEN pg_try_advisory_xact_lock(hashtextextended(%(lock_name)s, 0))
            ELSE true END AS locked
FROM (VALUES (1)) AS one
LEFT JOIN {schema}.idempotency_keys AS k
       ON k.client = %(client)s AND k.key = %(key)s AND k.expires_at > {schema}.clock_now()

-- store_key --
-- An expired record of the same key is replaced; an unexpired one is never overwritten
-- (no row comes back).
INSERT INTO {schema}.idempotency_keys
    (client, key, fingerprint, method, target, status, headers, body, expires_at)
VALUES
    (%(client)s, %(key)s, %(fingerprint)s, %(method)s, %(target)s, %(status)s, %(headers)s, %(body)s,
     {schema}.clock_now() + %(ttl)s::interval)
ON CONFLICT (client, key) DO UPDATE
    SET fingerprint = EXCLUDED.fingerprint,
        method = EXCLUDED.method,
        target = EXCLUDED.target,
        status = EXCLUDED.status,
        headers = EXCLUDED.headers,
        body = EXCLUDED.body,
        created_at = {schema}.clock_now(),
        expires_at = EXCLUDED.expires_at
    WHERE idempotency_keys.expires_at <= {schema}.clock_now()

-- prune_keys --
-- One batch of expired records (in no particular order: every one of them goes); rows
-- another transaction holds (a request replacing its expired record) wait for the next pass.
DELETE FROM {schema}.idempotency_keys
WHERE (client, key) IN (
    SELECT client, key FROM {schema}.idempotency_keys
    WHERE expires_at <= {schema}.clock_now()
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED)
