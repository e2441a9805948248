-- The loyalty service: points per customer, and the answers to HTTP requests by idempotency key.
CREATE TABLE loyalty.members (
    customer_id text   PRIMARY KEY,
    points      bigint NOT NULL DEFAULT 0 CHECK (points >= 0)
);

CREATE TABLE loyalty.requests (
    idempotency_key text        PRIMARY KEY,
    message_id      uuid        NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now()
);
