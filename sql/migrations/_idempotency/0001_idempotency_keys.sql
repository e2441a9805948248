-- Idempotency-Key records of an HTTP API (draft-ietf-httpapi-idempotency-key-header), opted
-- into by a service (estafeta.Idempotency) and applied with search_path set to its schema.
-- A record is written in the same transaction as the request's business change, its saga
-- row and its outbox rows: they commit together or not at all, so no crash separates them.
CREATE TABLE idempotency_keys (
    -- Who sent the key: keys are scoped per client, so two clients never share a record.
    client      text        NOT NULL,
    key         text        NOT NULL,
    -- SHA-256 (hex) of the request's method, target and canonical body: the same key sent
    -- with another request is refused (422), never answered with this record.
    fingerprint text        NOT NULL,
    method      text        NOT NULL,
    target      text        NOT NULL,
    -- The response the first request got, replayed to every repeat until expires_at.
    status      smallint    NOT NULL CHECK (status BETWEEN 100 AND 499),
    headers     jsonb       NOT NULL,
    body        bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (client, key)
);
-- Pruning finds expired records through it. Records are written in expiry order (now() plus
-- one TTL), so a BRIN index fits: tiny, and next to free to keep up on every insert, where
-- a btree would be one more index entry in each request's transaction.
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys USING brin (expires_at);
