-- Fencing tokens of Redis locks: for each lock key, the newest token this database has
-- seen. It lives in every service schema because the check must run in the same
-- transaction (and so the same database) as the writes it guards, and services may each
-- have their own database.
--
-- A holder records its token here in a transaction of its own, committed right after it
-- acquired the lock and before it reads anything; the guarded transaction re-reads the
-- row FOR SHARE as its last statement and rolls back if a newer token arrived. No row
-- lock is held while the step works, so a paused holder never blocks its successor.
CREATE TABLE fences (
    lock_key   text        PRIMARY KEY,
    token      bigint      NOT NULL,
    raised_at  timestamptz NOT NULL DEFAULT now()
);
