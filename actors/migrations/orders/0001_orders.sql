-- The Orders service: customers' orders. (The order saga's tables, saga_order and its log,
-- are created from the saga's declaration: estafeta.Saga.migration.)
CREATE TABLE orders (
    order_id        uuid        PRIMARY KEY,
    customer_id     text        NOT NULL,
    sku             text        NOT NULL,
    quantity        int         NOT NULL CHECK (quantity > 0),
    amount_cents    bigint      NOT NULL CHECK (amount_cents > 0),
    status          text        NOT NULL DEFAULT 'pending'
                                CHECK (status IN ('pending', 'confirmed', 'cancelled')),
    -- The client's key: placing an order twice with one key places it once.
    idempotency_key text        UNIQUE,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX orders_status ON orders (status);
CREATE INDEX orders_created_at ON orders (created_at);
