-- The loan saga's participants (tests/probe_sagas.py) record each action and compensation here,
-- in the order they ran.
CREATE TABLE test_ledger (
    id        bigserial PRIMARY KEY,
    loan_id   uuid      NOT NULL,
    step      text      NOT NULL,
    direction text      NOT NULL CHECK (direction IN ('done', 'undone'))
);
