"""Running projectors: one per projection at a time, many in parallel, woken by NOTIFY, polling as the fallback.

Each projector holds a session advisory lock on its projection for as long as it runs;
a second projector of the same projection waits as a standby and takes over when the
first one's connection ends (a crash, a SIGKILL, a stop). Every append NOTIFYs at commit
(the ``events_wake`` trigger); a projector also polls, and when the log has committed
events it may not read yet (an older transaction still runs somewhere on the server), it
looks again soon, backing off to the poll interval while that transaction stays open.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import dramatiq
import psycopg
from psycopg import sql

from estafeta.app.runtime import Runtime
from estafeta.events import projection_ops as ops
from estafeta.events.projections import BatchResult, Projector
from estafeta_sql import event_store, projection_store
from estafeta_sql.liveness import with_liveness
from estafeta_sql.pool import notifications

logger = logging.getLogger(__name__)

#: The first re-look while events are held back by an older open transaction (doubling, at most
#: HELD_BACK_MAX_RECHECK): transactions that never append (anywhere on the server) hold events
#: back too, and their end sends no NOTIFY.
HELD_BACK_RECHECK = 0.005
HELD_BACK_MAX_RECHECK = 0.1
#: Lag gauges are refreshed at most this often (seconds).
METRICS_INTERVAL = 1.0

BatchHook = Callable[[Projector, BatchResult], None]


class ProjectorsMiddleware(dramatiq.Middleware):
    """Runs an app's projectors in each worker process, from boot to shutdown (as the saga watchdog runs).

    Every process tries every projection; the advisory lock lets one of them apply it and
    keeps the others as standbys, so restarting the workers is all a projection needs.
    """

    def __init__(self, runtime: Runtime, projectors: Sequence[Projector]) -> None:
        self.runtime = runtime
        self.projectors = list(projectors)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def after_worker_boot(self, broker: dramatiq.Broker, worker: Any) -> None:
        self._stop.clear()
        by_dsn: dict[str, list[Projector]] = {}
        for projector in self.projectors:
            by_dsn.setdefault(self.runtime.dsn_for(projector.schema), []).append(projector)
        for dsn, projectors in by_dsn.items():
            thread = threading.Thread(target=run_projectors, args=(dsn, projectors, self._stop), daemon=True)
            thread.start()
            self._threads.append(thread)

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: Any) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads = []


class WakeListener(threading.Thread):
    """LISTENs on one database for appends and wakes the projectors of the schema named in each NOTIFY."""

    def __init__(self, dsn: str, wakes: dict[str, list[threading.Event]], stop: threading.Event) -> None:
        super().__init__(name="estafeta-projections-listener", daemon=True)
        self.dsn = dsn
        self.wakes = wakes
        self.stop = stop

    def run(self) -> None:
        """Listen until ``stop``; reconnect by itself (the projectors' polling covers the gap)."""
        failures = 0
        while not self.stop.is_set():
            try:
                with psycopg.connect(
                    with_liveness(self.dsn), autocommit=True, application_name="estafeta-projections-listener"
                ) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(event_store.WAKE_CHANNEL)))
                    failures = 0
                    self._wake_all()  # anything committed before LISTEN took effect was missed
                    while not self.stop.is_set():
                        for note in notifications(conn, 0.5):
                            for wake in self.wakes.get(note.payload, ()):
                                wake.set()
            except psycopg.Error as exc:
                failures += 1
                logger.info("projection listener lost its connection (%s); polling until it is back", exc)
                self.stop.wait(min(0.05 * 2**failures, 5.0))

    def _wake_all(self) -> None:
        for wakes in self.wakes.values():
            for wake in wakes:
                wake.set()


def run_projectors(
    dsn: str,
    projectors: Sequence[Projector],
    stop: threading.Event,
    *,
    poll_interval: float = 1.0,
    on_batch: BatchHook | None = None,
) -> dict[str, str]:
    """Run every projector in a thread of its own until ``stop`` is set; return how each ended.

    An outcome is ``stopped`` (``stop`` was set) or ``failed`` (the projection stopped on a
    bad event; ``estafeta projections status`` says which and why). One LISTEN connection
    wakes them all.
    """
    wakes: dict[str, list[threading.Event]] = {}
    events = [threading.Event() for _ in projectors]
    for projector, wake in zip(projectors, events, strict=True):
        wakes.setdefault(projector.schema, []).append(wake)
    listener = WakeListener(dsn, wakes, stop)
    listener.start()
    outcomes: dict[str, str] = {}

    def serve(projector: Projector, wake: threading.Event) -> None:
        try:
            outcome = run_projector(dsn, projector, stop, wake=wake, poll_interval=poll_interval, on_batch=on_batch)
        except Exception as exc:
            logger.exception("projector %s crashed", projector.checkpoint_name)
            outcome = f"crashed: {exc!r}"
        outcomes[projector.checkpoint_name] = outcome

    threads = [
        threading.Thread(target=serve, args=(projector, wake), name=f"estafeta-projector-{projector.checkpoint_name}")
        for projector, wake in zip(projectors, events, strict=True)
    ]
    for thread in threads:
        thread.start()
    stop.wait()
    for wake in events:
        wake.set()
    for thread in threads:
        thread.join()
    listener.join(timeout=5)
    return outcomes


def run_projector(
    dsn: str,
    projector: Projector,
    stop: threading.Event,
    *,
    wake: threading.Event | None = None,
    poll_interval: float = 1.0,
    on_batch: BatchHook | None = None,
) -> str:
    """Tail the log into one projection until ``stop`` is set (``stopped``) or it fails on a bad event (``failed``).

    Waits as a standby while another projector holds the projection; reconnects with
    backoff when the database is unreachable, never skipping or repeating an event.
    """
    wake = wake or _own_listener(dsn, projector.schema, stop)
    outage = 0.0
    while not stop.is_set():
        try:
            with psycopg.connect(
                with_liveness(dsn), autocommit=True, application_name=f"estafeta-projector:{projector.checkpoint_name}"
            ) as conn:
                # A standby keeps its connection and asks again every poll interval.
                while not _take_lock(conn, projector.lock_key):
                    if stop.wait(poll_interval):
                        return "stopped"
                if not _set_up(conn, projector):
                    return "failed"
                outage = 0.0
                return _tail(conn, projector, stop, wake, poll_interval, on_batch)
        except psycopg.OperationalError as exc:
            outage = min(max(outage * 2, 0.2), 10.0)
            logger.warning("projector %s paused %.1fs: %s", projector.checkpoint_name, outage, exc)
            stop.wait(outage)
    return "stopped"


def _set_up(conn: psycopg.Connection[Any], projector: Projector) -> bool:
    """Create the projection's tables; if they cannot be, record why on its checkpoint row and say so."""
    try:
        projector.create_tables(conn)
    except psycopg.OperationalError:
        raise  # the database, not the projection: retried
    except psycopg.Error as exc:
        lines = str(exc).strip().splitlines()
        reason = f"could not create its tables: {type(exc).__name__}: {lines[0] if lines else ''}"
        logger.error("projection %s stopped: %s", projector.checkpoint_name, reason)
        projection_store.ensure_checkpoint(conn, projector.schema, projector.checkpoint_name)
        projection_store.mark_failed(conn, projector.schema, projector.checkpoint_name, error=reason, position=None)
        return False
    projection_store.clear_setup_failure(conn, projector.schema, projector.checkpoint_name)
    return True


def _own_listener(dsn: str, schema: str, stop: threading.Event) -> threading.Event:
    wake = threading.Event()
    WakeListener(dsn, {schema: [wake]}, stop).start()
    threading.Thread(target=_set_on, args=(stop, wake), daemon=True).start()
    return wake


def _set_on(stop: threading.Event, wake: threading.Event) -> None:
    """Wake the projector as soon as it must stop, not after its poll interval."""
    stop.wait()
    wake.set()


def _take_lock(conn: psycopg.Connection[Any], key: str) -> bool:
    row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,)).fetchone()
    return bool(row and row[0])


def _tail(
    conn: psycopg.Connection[Any],
    projector: Projector,
    stop: threading.Event,
    wake: threading.Event,
    poll_interval: float,
    on_batch: BatchHook | None,
) -> str:
    recheck = HELD_BACK_RECHECK
    refreshed = 0.0
    while not stop.is_set():
        wake.clear()
        result = projector.run_batch(conn)
        ops.observe_batch(projector, result)
        if on_batch is not None:
            on_batch(projector, result)
        if result.failed is not None:
            return "failed"
        if result.more:
            continue
        if time.monotonic() - refreshed >= METRICS_INTERVAL:
            ops.refresh_lag(conn, projector, result.checkpoint)
            refreshed = time.monotonic()
        if event_store.held_back(conn, projector.schema, after=result.checkpoint):
            wake.wait(recheck)
            recheck = min(recheck * 2, poll_interval, HELD_BACK_MAX_RECHECK)
            continue
        recheck = HELD_BACK_RECHECK
        wake.wait(poll_interval)
    return "stopped"
