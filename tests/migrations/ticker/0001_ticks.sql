-- The effect of each fired tick: one row per (schedule, tick), and how many times a step
-- ran for it (the inbox makes a re-published copy a no-op, so more than 1 is a bug).
CREATE TABLE ticks (
    schedule  text        NOT NULL,
    tick      timestamptz NOT NULL,
    runs      int         NOT NULL DEFAULT 1,
    -- When the step first recorded it (PostgreSQL's own time): a tick caught up after a
    -- downtime is recorded seconds after the tick.
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (schedule, tick)
);
