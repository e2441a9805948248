-- The mailer service of the choreography example: each mail once.
CREATE TABLE sent (
    customer_id uuid        NOT NULL,
    kind        text        NOT NULL,
    saga_id     uuid,
    sent_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (customer_id, kind)
);
