-- The customers service of the choreography example.
CREATE TABLE customers (
    customer_id   uuid        PRIMARY KEY,
    email         text        NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    -- Filled in when the bonus service announces the customer's bonus.
    bonus_points  int
);
