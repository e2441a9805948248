-- Deliveries that died with their process, counted apart from deliveries that failed.
--
-- inbox_attempts counts every delivery of a message before its work, in a transaction of its
-- own, and a message past ESTAFETA_MAX_DELIVERIES (25 by default: Dramatiq's retries of an
-- ordinary failure, and then some) is parked. A delivery that kills its worker (SIGKILL, an
-- OOM kill, a segfault) counted the same, so such a message restarted its worker 25 times
-- before it was parked, and after each restart the messages the dead process held ran
-- alone. Now each counted delivery is marked unfinished when it starts; a step that raises
-- marks it finished (end_attempt) once its transaction has rolled back. The next count of a
-- message whose last counted delivery is still unfinished adds one to its deaths: that
-- delivery died with its process. A message whose deaths reach ESTAFETA_MAX_WORKER_DEATHS
-- (3 by default) is parked, without running again. Rows counted before this migration
-- start with no death.
ALTER TABLE inbox_attempts
    ADD COLUMN unfinished boolean NOT NULL DEFAULT false,
    ADD COLUMN deaths int NOT NULL DEFAULT 0;
