"""The saga watchdog: moves on every live saga that is past its deadline.

Deadlines live in the saga rows (not in Dramatiq delays, which RabbitMQ's consumer
timeout and a Redis restart can break), so any process can act on them: the watchdog
sends the command a saga waits for again (a new attempt, answered again by a participant
that is idempotent by business key), and once the step's attempts are spent it fails the
step — compensating — or, for a compensation or a step past the point of no return, gives
the saga up (``gave_up``) for an operator: not a final failure, since the participant may
still answer, and that late answer moves the saga on.

It runs inside every ``dramatiq`` worker process of an app with sagas (:class:`WatchdogMiddleware`),
so restarting the workers after a crash is enough for every in-flight saga to finish;
``estafeta sagas watch`` runs it alone. Several watchdogs at once are safe: each saga is
claimed with ``FOR UPDATE SKIP LOCKED`` and re-checked under its lock.

It never dies of one saga. Overdue sagas are listed most overdue first, so a saga that
raises would stop every watchdog at the same row: instead the error is logged with the
saga's id and recorded on its row (``last_error``, and an ``error`` entry in its log). A
saga that can never move on as declared now (its payload no longer decodes, its step was
renamed, its command has two handlers) is ``failed`` at once, for ``estafeta sagas
resume`` once the cause is fixed; any other error of its own (a database error of its
transition — a constraint, bad data, its ``on_transition`` hook failing — or a bug in its
code) looks again one step timeout later, and the saga is ``failed`` at the
``max_errors``-th error in a row (3 by default). An error is only recorded on a saga still
where it was diagnosed (same version, same attempt): one that has moved on since is left
alone. Only an outage (:class:`~estafeta_sql.errors.DatabaseUnavailable`) of a saga's own database
pauses the watchdog, and only after the saga kinds on other databases had their turn; a
participant's database that is unreachable delays only the sagas that need it (to read
why it parked their command, once their attempts are spent), and nothing is recorded on
them.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta

import prometheus_client
import psycopg.errors

from estafeta.app.middleware import WorkerThread
from estafeta.app.runtime import Runtime
from estafeta.observability import tracing as tracing
from estafeta.sagas.model import SagaStuck
from estafeta.sagas.saga import Saga
from estafeta.sagas.saga_metrics import TRANSITIONS
from estafeta_sql import saga_writes
from estafeta_sql import sagas as store
from estafeta_sql.errors import DatabaseError, DatabaseUnavailable
from estafeta_sql.sagas import SagaRow

logger = logging.getLogger(__name__)

#: Errors in a row (each a step timeout apart) after which the watchdog fails a saga.
MAX_ERRORS = 3
#: Seconds the watchdog waits for a connection to a participant's database before it lets
#: the sagas that need it wait for the next pass.
PARTICIPANT_WAIT = 2.0
#: Errors of one saga met by the watchdog (recorded on its row), by saga kind.
WATCHDOG_ERRORS = prometheus_client.Counter(
    "estafeta_saga_watchdog_errors", "Errors of one saga met by the saga watchdog, by saga", ["saga"]
)


class Watchdog:
    """Looks for sagas past their deadline and moves them on, one transaction per saga."""

    def __init__(
        self, runtime: Runtime, sagas: Sequence[Saga], *, batch_size: int = 200, max_errors: int = MAX_ERRORS
    ) -> None:
        self.runtime = runtime
        #: The saga kinds watched.
        self.sagas = list(sagas)
        self.batch_size = batch_size
        #: Errors in a row after which a saga is failed for an operator.
        self.max_errors = max_errors

    def check_once(self) -> Counter[str]:
        """Handle every saga overdue now; return how many were ``resent``, ``compensating``, ``gave_up``.

        A saga that raises is counted as ``failed`` (recorded failed on its row) or
        ``error`` (``last_error`` recorded, looked at again later), one whose participant's
        database is unreachable as ``waiting``; the others go on. Raises
        :class:`DatabaseUnavailable` once every saga kind had its turn if the database of
        one of them was unreachable.
        """
        done: Counter[str] = Counter()
        down: set[str] = set()  # DSNs of participants found unreachable in this pass
        outage: DatabaseUnavailable | None = None
        for saga in self.sagas:
            try:
                self._check_kind(saga, done, down)
            except DatabaseUnavailable as exc:
                outage = outage or exc  # this kind's own database: the kinds on other databases go on
        if outage is not None:
            raise outage
        return done

    def _check_kind(self, saga: Saga, done: Counter[str], down: set[str]) -> None:
        with self.runtime.database(saga.service).connection() as conn:
            overdue = store.overdue(conn, saga.table, self.batch_size)
        for saga_id in overdue:
            outcome = self._handle_one(saga, saga_id, down)
            if outcome:
                done[outcome] += 1

    def _handle_one(self, saga: Saga, saga_id: uuid.UUID, down: set[str]) -> str | None:
        with self.runtime.database(saga.service).connection() as conn:
            seen = store.get(conn, saga.table, saga_id)
        if seen is None or not seen.live:
            return None
        try:
            return self._move_on(saga, seen, down)
        except DatabaseUnavailable:
            raise  # an outage of the saga's own database, not this saga's fault: the watchdog pauses
        except Exception as exc:
            return self._failed_attempt(saga, seen, exc)

    def _failed_attempt(self, saga: Saga, seen: SagaRow, exc: Exception) -> str | None:
        WATCHDOG_ERRORS.labels(saga.name).inc()
        error = f"watchdog: {type(exc).__name__}: {exc}"
        try:
            outcome = self._record(saga, seen, error, final=isinstance(exc, SagaStuck))
        except DatabaseUnavailable:
            raise
        except Exception:
            # Even its error cannot be written (its row breaks a constraint?): the log says so, the others go on.
            logger.exception("saga %s %s: the watchdog cannot record its error: %s", saga.name, seen.saga_id, error)
            return "error"
        logger.error(
            "saga %s %s: the watchdog cannot move it on%s: %s",
            saga.name,
            seen.saga_id,
            {"failed": " (failed until resumed)", None: " (it has moved on since)"}.get(outcome, ""),
            error,
            exc_info=not isinstance(exc, SagaStuck | DatabaseError),  # a bug in code: its traceback
        )
        return outcome

    def _record(self, saga: Saga, seen: SagaRow, error: str, *, final: bool) -> str | None:
        """Say on the saga's row why it did not move on; fail it when it never can, or after ``max_errors`` in a row.

        Only if the row is still as diagnosed (``seen``): ``None`` if it has moved on since.
        """
        # Only the store's columns: the saga's definition may be what is broken.
        with self.runtime.database(saga.service).transaction() as conn:
            row = store.lock(conn, saga.table, seen.saga_id)
            if row is None or not _unchanged(row, seen):
                return None
            if not final:
                errors = saga_writes.record_error(conn, saga.table, row, error)
                if errors < self.max_errors:
                    return "error"
                error = f"{error} ({errors} errors in a row)"
            saga_writes.transition(
                conn,
                saga.table,
                row,
                status="failed",
                step=row.current_step,
                wait=timedelta(0),
                last_error=error,
                event="failed",
                detail=error,
            )
        TRANSITIONS.labels(saga.name, "failed").inc()
        return "failed"

    def handle(self, saga: Saga, saga_id: uuid.UUID) -> str | None:
        """Move one overdue saga on; ``None`` if it is no longer overdue or another process holds it.

        ``waiting`` if it needs its participant's database and that is unreachable.
        """
        with self.runtime.database(saga.service).connection() as conn:
            seen = store.get(conn, saga.table, saga_id)
        if seen is None or not seen.live:
            return None
        return self._move_on(saga, seen, set())

    def _move_on(self, saga: Saga, seen: SagaRow, down: set[str]) -> str | None:
        handler, message_id = saga.target(seen)
        parked: str | None = None
        if saga.attempts_spent(seen):
            # Giving up on the command: why the participant parked it (if it did) says why.
            # Read before locking the saga row: the participant may live in another database,
            # and no lock should wait on a second pool.
            participant = self.runtime.database(handler.service)
            if participant.dsn in down:
                return "waiting"
            try:
                with participant.connection(timeout=PARTICIPANT_WAIT) as conn:
                    parked = store.dead_letter_reason(conn, handler.service, handler.actor_name, message_id)
            except DatabaseUnavailable as exc:
                if participant is self.runtime.database(saga.service):
                    raise
                down.add(participant.dsn)
                logger.warning("saga %s %s waits for %s: %s", saga.name, seen.saga_id, handler.service, exc)
                return "waiting"
        # The saga row keeps no trace context: what a deadline sends starts a trace of its own.
        deadline = tracing.span(f"saga deadline {saga.name}", **{"estafeta.saga.id": str(seen.saga_id)})
        with deadline, self.runtime.database(saga.service).transaction() as conn:
            row = store.lock_overdue(conn, saga.table, seen.saga_id)
            if row is None or not _unchanged(row, seen):
                return None
            outcome = saga.on_deadline(conn, row, parked)
        logger.info("saga %s %s past its deadline at %s: %s", saga.name, seen.saga_id, row.current_step, outcome)
        return outcome

    def run(self, stop: threading.Event, interval: float | None = None) -> None:
        """Check every ``interval`` seconds until ``stop`` is set; errors only pause it, it never dies."""
        interval = interval or self.runtime.settings.saga_watch_interval
        pause = interval
        while not stop.is_set():
            try:
                self.check_once()
                pause = interval
            except DatabaseError as exc:
                pause = min(max(pause * 2, interval), 30.0)
                if isinstance(exc.__cause__, psycopg.errors.UndefinedTable):
                    logger.info("saga watchdog idle: the saga tables are not migrated yet (estafeta migrate)")
                else:
                    logger.warning("saga watchdog paused %.1fs: %s", pause, exc)
            except Exception:
                # Not one saga's error (those are recorded on their rows): still, never die.
                pause = min(max(pause * 2, interval), 30.0)
                logger.exception("saga watchdog paused %.1fs by an unexpected error", pause)
            stop.wait(pause)


def _unchanged(row: SagaRow, seen: SagaRow) -> bool:
    """Whether the locked ``row`` is still the live state ``seen`` was read (and diagnosed) in."""
    return row.live and (row.version, row.attempts) == (seen.version, seen.attempts)


class WatchdogMiddleware(WorkerThread):
    """Runs a :class:`Watchdog` thread in each worker process, from boot to shutdown."""

    thread_name = "estafeta-saga-watchdog"

    def __init__(self, runtime: Runtime, sagas: Sequence[Saga]) -> None:
        super().__init__()
        self.runtime = runtime
        self.sagas = list(sagas)

    def run(self, stop: threading.Event) -> None:
        Watchdog(self.runtime, self.sagas).run(stop)
