-- The Inventory service: stock per SKU, and what each order reserved.
CREATE TABLE stock (
    sku        text        PRIMARY KEY,
    available  int         NOT NULL CHECK (available >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- One row per order, ever (see payments.payments): a release of an order that reserved
-- nothing leaves a 'released' row of quantity 0, so a late reservation is refused.
CREATE TABLE reservations (
    order_id   uuid        PRIMARY KEY,
    sku        text        NOT NULL,
    quantity   int         NOT NULL CHECK (quantity >= 0),
    status     text        NOT NULL CHECK (status IN ('reserved', 'released')),
    saga_id    uuid,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX reservations_saga_id ON reservations (saga_id);
CREATE INDEX reservations_sku ON reservations (sku);
