-- The messaging tables every service schema carries. Applied once per service with
-- search_path set to that service's schema, so the names below land in it.

-- Commands and events waiting for the relay. A row is deleted once the broker confirmed
-- it; nothing ever flips it to "published" (that only bloats the table).
CREATE TABLE outbox (
    id           bigserial   PRIMARY KEY,
    message_id   uuid        NOT NULL UNIQUE,
    queue_name   text        NOT NULL,
    actor_name   text        NOT NULL,
    -- Dramatiq's args, kwargs and options: exactly what the relay publishes.
    message      jsonb       NOT NULL,
    -- Rows with the same key reach the broker in commit order.
    ordering_key text,
    saga_id      uuid,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- Not published before this instant (delayed sends, publish backoff).
    available_at timestamptz NOT NULL DEFAULT now(),
    attempts     int         NOT NULL DEFAULT 0,
    last_error   text,
    status       text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'failed'))
);

-- The relay claims pending rows in id order.
CREATE INDEX outbox_pending ON outbox (id) WHERE status = 'pending';
-- Per-key order checks look for an older row of the same key.
CREATE INDEX outbox_ordering_key ON outbox (ordering_key, id) WHERE ordering_key IS NOT NULL;

-- Messages this service has processed: the primary key turns a duplicate delivery into a
-- no-op, because the row is inserted in the same transaction as the message's effect.
CREATE TABLE inbox (
    consumer     text        NOT NULL,
    message_id   uuid        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX inbox_processed_at ON inbox (processed_at);

-- Deliveries started but not finished, committed before the work begins: a message that
-- keeps killing its worker (SIGKILL, OOM) is redelivered without Dramatiq counting it,
-- so it is counted here and parked once it passes the limit.
CREATE TABLE inbox_attempts (
    consumer        text        NOT NULL,
    message_id      uuid        NOT NULL,
    attempts        int         NOT NULL DEFAULT 1,
    last_attempt_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

-- Messages this service will not process, with the reason, for an operator.
CREATE TABLE dead_letters (
    id         bigserial   PRIMARY KEY,
    consumer   text        NOT NULL,
    message_id text        NOT NULL,
    message    jsonb       NOT NULL,
    reason     text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
