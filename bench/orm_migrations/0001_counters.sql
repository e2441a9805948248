-- The table the ORM comparison's steps change (bench/orm_steps.py).
CREATE TABLE counters (
    counter_id uuid PRIMARY KEY,
    value bigint NOT NULL DEFAULT 0
);
