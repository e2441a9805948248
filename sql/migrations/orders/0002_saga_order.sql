-- The order saga's state (the shape every saga table of actors/saga.py has: saga_<name>
-- with a key column, here order_id). Nothing about a saga lives only in memory: its
-- current step, its deadline and what its steps answered are here, so any process can
-- resume it after a crash.
CREATE TABLE saga_order (
    saga_id       uuid        PRIMARY KEY,
    order_id      uuid        NOT NULL,
    status        text        NOT NULL
                  CHECK (status IN ('running', 'compensating', 'completed', 'compensated', 'failed')),
    -- The step whose reply the saga waits for (its action while running, its compensation
    -- while compensating); the last one reached once the saga has ended.
    current_step  text        NOT NULL,
    -- The saga's data (the order), as given when it started.
    payload       jsonb       NOT NULL,
    -- What each step's action answered, by step name.
    results       jsonb       NOT NULL DEFAULT '{}',
    -- The compensations to run, in order, fixed when compensation starts (NULL before).
    compensations text[],
    -- Sends of the current command (the first, then the watchdog's re-sends).
    attempts      int         NOT NULL DEFAULT 1,
    -- How long to wait for a reply when the step declares no timeout of its own.
    step_timeout  interval    NOT NULL,
    -- When the watchdog re-sends the current command (NULL once the saga has ended).
    deadline_at   timestamptz,
    started_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    completed_at  timestamptz,
    -- Why the saga compensated or failed.
    last_error    text,
    -- Bumped by every transition; a reply carries the version of the command it answers,
    -- so duplicate, stale and late replies are recognised and change nothing.
    version       int         NOT NULL DEFAULT 1
);

-- Almost every row soon ends; the watchdog and `sagas list --stuck` look only at live ones.
CREATE INDEX saga_order_live ON saga_order (deadline_at) WHERE status IN ('running', 'compensating');
CREATE INDEX saga_order_order_id ON saga_order (order_id);
CREATE INDEX saga_order_started_at ON saga_order (started_at);

-- Every transition of every saga: `estafeta sagas show` prints a saga's timeline from it.
CREATE TABLE saga_order_log (
    id        bigserial   PRIMARY KEY,
    saga_id   uuid        NOT NULL,
    version   int         NOT NULL,
    status    text        NOT NULL,
    step      text        NOT NULL,
    event     text        NOT NULL,
    detail    text,
    at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX saga_order_log_saga ON saga_order_log (saga_id, id);
