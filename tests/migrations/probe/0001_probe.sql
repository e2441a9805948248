-- The probe service: tables of the test-only steps (tests/steps.py, tests/lock_steps.py).
CREATE TABLE pings (
    ping_id   uuid        PRIMARY KEY,
    sent_at   timestamptz NOT NULL,
    ponged_at timestamptz,
    pongs     int         NOT NULL DEFAULT 0
);

-- The charge-like lock test step: one account per order.
CREATE TABLE test_accounts (
    order_id      uuid    PRIMARY KEY,
    balance_cents bigint  NOT NULL,
    charged       boolean NOT NULL DEFAULT false
);
-- One row per committed run of the step: charged = false when the order already was.
CREATE TABLE test_charges (
    id            bigserial PRIMARY KEY,
    order_id      uuid      NOT NULL,
    message_id    uuid      NOT NULL,
    charged       boolean   NOT NULL,
    amount_cents  bigint    NOT NULL,
    fencing_token bigint,
    worker_pid    int       NOT NULL
);
