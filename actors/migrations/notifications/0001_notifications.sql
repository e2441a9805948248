-- The Notifications service: what each customer was told about each order, once.
CREATE TABLE sent (
    order_id    uuid        NOT NULL,
    kind        text        NOT NULL,
    customer_id text        NOT NULL,
    saga_id     uuid,
    sent_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (order_id, kind)
);
