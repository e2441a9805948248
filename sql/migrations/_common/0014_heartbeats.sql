-- Heartbeats: one row per long-running process (and per role it plays) serving this service.
--
-- A process writes its row at start and again every beat (on a connection it already holds),
-- and deletes it when it stops cleanly. A process killed outright leaves its row behind: the
-- row's last_beat then stops moving, and a reader calls it stale once it is older than
-- three beats. Stale rows are deleted by the beats of the other processes after a day.
CREATE TABLE heartbeats (
    -- Made by the process at start: a pid may be reused, this never is.
    process_id uuid NOT NULL,
    -- worker, relay, projector, scheduler or serve: a worker process that also fires schedules
    -- and runs projectors has three rows.
    kind text NOT NULL CHECK (kind IN ('worker', 'relay', 'projector', 'scheduler', 'serve')),
    -- What it serves here: queues (worker), outboxes (relay), projections (projector),
    -- schedules (scheduler); nothing for serve.
    serves text[] NOT NULL DEFAULT '{}',
    -- Worker threads, relay lanes, projections running: how much of it there is.
    threads integer NOT NULL DEFAULT 1,
    host text NOT NULL,
    pid integer NOT NULL,
    version text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_now(),
    last_beat timestamptz NOT NULL DEFAULT clock_now(),
    -- Seconds between its beats: a reader calls the row stale past three of them.
    beat_interval double precision NOT NULL,
    PRIMARY KEY (process_id, kind)
);
CREATE INDEX heartbeats_last_beat ON heartbeats (last_beat);
