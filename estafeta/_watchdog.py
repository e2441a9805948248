"""The saga watchdog: moves on every live saga that is past its deadline.

Deadlines live in the saga rows (not in Dramatiq delays, which RabbitMQ's consumer
timeout and a Redis restart can break), so any process can act on them: the watchdog
sends the command a saga waits for again (a new attempt, answered again by a participant
that is idempotent by business key), and once the step's attempts are spent it fails the
step — compensating — or fails the saga for an operator.

It runs inside every ``dramatiq`` worker process of an app with sagas (:class:`WatchdogMiddleware`),
so restarting the workers after a crash is enough for every in-flight saga to finish;
``estafeta sagas watch`` runs it alone. Several watchdogs at once are safe: each saga is
claimed with ``FOR UPDATE SKIP LOCKED`` and re-checked under its lock.

It never dies of one saga. Overdue sagas are listed most overdue first, so a saga that
raises would stop every watchdog at the same row: instead the error is logged with the
saga's id and recorded on its row (``last_error``); a saga that can never move on as
declared now (its payload no longer decodes, its step was renamed, its command has two
handlers) is ``failed``, for ``estafeta sagas resume`` once the cause is fixed, and any
other error looks again one step timeout later. Database outages pause the watchdog.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import dramatiq
import psycopg.errors

from sql import sagas as store
from sql.errors import DatabaseError

from . import _tracing as tracing
from ._runtime import Runtime
from ._saga import TRANSITIONS, Saga
from ._saga_model import SagaStuck

logger = logging.getLogger(__name__)


class Watchdog:
    """Looks for sagas past their deadline and moves them on, one transaction per saga."""

    def __init__(self, runtime: Runtime, sagas: Sequence[Saga], *, batch_size: int = 200) -> None:
        self.runtime = runtime
        #: The saga kinds watched.
        self.sagas = list(sagas)
        self.batch_size = batch_size

    def check_once(self) -> Counter[str]:
        """Handle every saga overdue now; return how many were ``resent``, ``compensating``, ``failed``.

        A saga that raises is counted as ``failed`` (recorded failed on its row) or
        ``error`` (``last_error`` recorded, looked at again later); the others go on.
        """
        done: Counter[str] = Counter()
        for saga in self.sagas:
            with self.runtime.database(saga.service).connection() as conn:
                overdue = store.overdue(conn, saga.table, self.batch_size)
            for saga_id in overdue:
                outcome = self._handle_one(saga, saga_id)
                if outcome:
                    done[outcome] += 1
        return done

    def _handle_one(self, saga: Saga, saga_id: uuid.UUID) -> str | None:
        try:
            return self.handle(saga, saga_id)
        except DatabaseError:
            raise  # an outage, not this saga's fault: the watchdog pauses
        except Exception as exc:
            final = isinstance(exc, SagaStuck)
            logger.error(
                "saga %s %s: the watchdog cannot move it on%s: %s",
                saga.name,
                saga_id,
                " (failed until resumed)" if final else "",
                exc,
                exc_info=not final,
            )
            self._record(saga, saga_id, f"watchdog: {type(exc).__name__}: {exc}", final=final)
            return "failed" if final else "error"

    def _record(self, saga: Saga, saga_id: uuid.UUID, error: str, *, final: bool) -> None:
        """Say on the saga's row why it did not move on; fail it when it never can as declared."""
        # Only the store's columns: the saga's definition may be what is broken.
        with self.runtime.database(saga.service).transaction() as conn:
            row = store.lock(conn, saga.table, saga_id)
            if row is None or not row.live:
                return
            if not final:
                store.record_error(conn, saga.table, row, error)
                return
            store.transition(
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

    def handle(self, saga: Saga, saga_id: uuid.UUID) -> str | None:
        """Move one overdue saga on; ``None`` if it is no longer overdue or another process holds it."""
        database = self.runtime.database(saga.service)
        with database.connection() as conn:
            seen = store.get(conn, saga.table, saga_id)
        if seen is None or not seen.live:
            return None
        # Read the participant's dead letters before locking the saga row: the participant
        # may live in another database, and no lock should wait on a second pool.
        handler, message_id = saga.target(seen)
        with self.runtime.database(handler.service).connection() as conn:
            parked = store.dead_letter_reason(conn, handler.service, handler.actor_name, message_id)
        # The saga row keeps no trace context: what a deadline sends starts a trace of its own.
        deadline = tracing.span(f"saga deadline {saga.name}", **{"estafeta.saga.id": str(saga_id)})
        with deadline, database.transaction() as conn:
            row = store.lock_overdue(conn, saga.table, saga_id)
            if row is None or row.version != seen.version:
                return None
            outcome = saga.on_deadline(conn, row, parked)
        logger.info("saga %s %s past its deadline at %s: %s", saga.name, saga_id, row.current_step, outcome)
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


class WatchdogMiddleware(dramatiq.Middleware):
    """Runs a :class:`Watchdog` thread in each worker process, from boot to shutdown."""

    def __init__(self, runtime: Runtime, sagas: Sequence[Saga]) -> None:
        self.runtime = runtime
        self.sagas = list(sagas)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def after_worker_boot(self, broker: dramatiq.Broker, worker: Any) -> None:
        self._stop.clear()
        watchdog = Watchdog(self.runtime, self.sagas)
        self._thread = threading.Thread(target=watchdog.run, args=(self._stop,), name="estafeta-saga-watchdog")
        self._thread.daemon = True
        self._thread.start()

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
