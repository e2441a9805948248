-- The tables of one saga kind, generated for each Saga an app declares (sql/sagas.py:
-- table_migrations, recorded as `<table>/0001_tables.sql`). Applied with search_path set to the owning service's schema; the
-- table, log, key and index names are bound as identifiers, the key's type as a type name.
-- IF NOT EXISTS: a database whose tables came from a hand-written migration of the
-- same shape (the order system's before 0.2) records this one and changes nothing.

-- Nothing about a saga lives only in memory: its current step, its deadline and what its
-- steps answered are here, so any process can resume it after a crash.
CREATE TABLE IF NOT EXISTS {table} (
    saga_id       uuid        PRIMARY KEY,
    {key}         {key_type}  NOT NULL,
    status        text        NOT NULL
                  CHECK (status IN ('running', 'compensating', 'completed', 'compensated', 'failed')),
    -- The step whose reply the saga waits for (its action while running, its compensation
    -- while compensating); the last one reached once the saga has ended.
    current_step  text        NOT NULL,
    -- The saga's data, as given when it started.
    payload       jsonb       NOT NULL,
    -- What each step's action answered, by step name.
    results       jsonb       NOT NULL DEFAULT '{{}}',
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
CREATE INDEX IF NOT EXISTS {live_index} ON {table} (deadline_at) WHERE status IN ('running', 'compensating');
CREATE INDEX IF NOT EXISTS {key_index} ON {table} ({key});
CREATE INDEX IF NOT EXISTS {started_index} ON {table} (started_at);

-- Every transition of every saga: `estafeta sagas show` prints a saga's timeline from it.
CREATE TABLE IF NOT EXISTS {log} (
    id        bigserial   PRIMARY KEY,
    saga_id   uuid        NOT NULL,
    version   int         NOT NULL,
    status    text        NOT NULL,
    step      text        NOT NULL,
    event     text        NOT NULL,
    detail    text,
    at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS {log_index} ON {log} (saga_id, id);
