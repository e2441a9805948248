-- Test-only tables of the charge-like step in tests/lock_steps.py (pingpong schema, so
-- the usual wipe between tests empties them).
CREATE TABLE IF NOT EXISTS pingpong.test_accounts (
    order_id      uuid    PRIMARY KEY,
    balance_cents bigint  NOT NULL,
    charged       boolean NOT NULL DEFAULT false
);
-- One row per committed run of the step: charged = false when the order already was.
CREATE TABLE IF NOT EXISTS pingpong.test_charges (
    id            bigserial PRIMARY KEY,
    order_id      uuid      NOT NULL,
    message_id    uuid      NOT NULL,
    charged       boolean   NOT NULL,
    amount_cents  bigint    NOT NULL,
    fencing_token bigint,
    worker_pid    int       NOT NULL
);
