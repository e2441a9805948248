-- The bonus service of the choreography example: one welcome bonus per customer.
CREATE TABLE bonuses (
    customer_id  uuid        PRIMARY KEY,
    level        text        NOT NULL,
    points       int         NOT NULL,
    saga_id      uuid,
    activated_at timestamptz NOT NULL DEFAULT now()
);
