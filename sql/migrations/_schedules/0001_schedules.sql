-- Recurring schedules of the service (`@service.schedule(...)`), one row each, for the
-- services that declare some. The row is the schedule's whole state: the firing pass of
-- every worker process claims a due row with FOR UPDATE SKIP LOCKED, writes the command
-- to the outbox and moves next_fire_at on, in one transaction, so each tick is fired by
-- exactly one process, once, whatever crashes.
CREATE TABLE schedules (
    name            text        PRIMARY KEY,
    -- What next_fire_at was computed from ("cron */5 * * * * Europe/Madrid", "every 0:00:01"):
    -- a deploy that changes the declaration starts again from the next tick of the new one.
    spec            text        NOT NULL,
    -- The next tick to fire; a pass fires it once clock_now() reaches it.
    next_fire_at    timestamptz NOT NULL,
    paused          boolean     NOT NULL DEFAULT false,
    -- The last tick fired (manual triggers included) and when, by the schema's clock.
    last_tick       timestamptz,
    last_fired_at   timestamptz,
    -- The message the last firing sent: the overlap policy asks whether it was processed.
    last_message_id uuid,
    last_actor      text,
    -- What the last pass over a due tick did (fired, skipped: ..., missed ...), and when.
    last_outcome    text,
    last_outcome_at timestamptz,
    fired           bigint      NOT NULL DEFAULT 0,
    skipped         bigint      NOT NULL DEFAULT 0,
    missed          bigint      NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT clock_now()
);
