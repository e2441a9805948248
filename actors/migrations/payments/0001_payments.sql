-- The Payments service: customers' money, and what each order was charged.
CREATE TABLE accounts (
    customer_id   text        PRIMARY KEY,
    balance_cents bigint      NOT NULL CHECK (balance_cents >= 0),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- One row per order, ever: a second charge of an order finds this row instead of the
-- customer's money. A refund of an order that was never charged leaves a 'refunded' row
-- of 0 cents, so a charge arriving late (after its saga gave up on it) is refused.
CREATE TABLE payments (
    payment_id   uuid        PRIMARY KEY,
    order_id     uuid        NOT NULL UNIQUE,
    customer_id  text        NOT NULL,
    amount_cents bigint      NOT NULL CHECK (amount_cents >= 0),
    status       text        NOT NULL CHECK (status IN ('charged', 'refunded')),
    saga_id      uuid,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX payments_saga_id ON payments (saga_id);
CREATE INDEX payments_customer_id ON payments (customer_id);
