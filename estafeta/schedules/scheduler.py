"""Firing recurring schedules: each tick once, whichever worker processes run and crash.

Every ``dramatiq`` worker process of an app with schedules runs a :class:`Scheduler`
pass about once a second (:class:`SchedulerMiddleware`), and ``estafeta.testing``'s
virtual clock runs one after each move. A pass fires each due schedule in one
transaction of its service's database:

0. write down, committed on its own, the tick it begins to fire (so that a pass that
   finds it there later knows a firing began and never committed);
1. lock the schedule's row if its ``next_fire_at`` has come (``FOR UPDATE SKIP LOCKED``:
   another process firing it is skipped, never waited for);
2. choose the ticks to fire by the catch-up policy, and drop those the overlap policy
   skips (the previous run's fate was read before the lock: no lock waits on a second
   database);
3. write each tick's command to the service's outbox, with a message id derived from
   the schedule and the tick;
4. move ``next_fire_at`` past the ticks handled and record the outcome on the row.

The commit makes all of it or none of it: a process killed before the commit fired
nothing (the next pass, in any process, fires the tick), and after the commit the tick
is no longer due anywhere. The relay publishes the command like any other outbox row;
the receiving step's inbox absorbs a re-publish. A schedule whose function raises is
recorded on its row and tried again next pass; the other schedules go on. An unreachable
database holds back only the schedules that need it (:mod:`estafeta.schedules.holds`):
those of its services, and those whose overlap policy must ask it about their previous
run; their due ticks go by their catch-up policy once it is back.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import timedelta
from typing import Any

import attrs
import psycopg
import psycopg.errors

from estafeta.app.middleware import WorkerThread
from estafeta.app.runtime import Runtime
from estafeta.schedules.holds import HeldBack
from estafeta.schedules.plan import plan, send_tick
from estafeta.schedules.runs import HANDLER_WAIT, UNFINISHED, RunUnknown, ScheduleState, run_status
from estafeta.schedules.spec import DeclaredOtherwise, Overlap, Schedule
from estafeta_sql import clock
from estafeta_sql import schedule_store as store
from estafeta_sql.errors import DatabaseError, DatabaseUnavailable

logger = logging.getLogger(__name__)

#: Seconds between a worker's registrations of its schedules (see :meth:`Scheduler.run`).
REGISTER_AGAIN_SECONDS = 60.0
#: A schedule that the registering workers did not declare for this long (removed from the
#: code), declared again, starts from its first tick after now, as after a pause. A shorter
#: absence (old and new workers of a rolling deploy taking turns) is caught up as a downtime.
LONG_ABSENCE = timedelta(minutes=10)


@attrs.frozen
class _Previous:
    """The previous run of an ``overlap="skip"`` schedule, as read before its firing."""

    message_id: uuid.UUID | None
    #: Its status if it is unfinished (the ticks are skipped), else ``None``.
    unfinished: str | None


class Scheduler:
    """Fires the due ticks of ``schedules``, one transaction per schedule."""

    def __init__(self, runtime: Runtime, schedules: Iterable[Schedule]) -> None:
        self.runtime = runtime
        #: The schedules fired, by ``service.name``.
        self.schedules = {s.full_name: s for s in schedules}
        #: The databases and services a failure holds back, each for a pause of its own.
        self.held = HeldBack()
        self._registered: set[str] = set()
        # Schedules that could not fire in the last pass (an error, a database held back):
        # tried again next pass, left out of the time to the next tick meanwhile.
        self._stalled: set[str] = set()

    def by_service(self) -> dict[str, list[Schedule]]:
        """The schedules grouped by the service that owns them."""
        found: dict[str, list[Schedule]] = {}
        for schedule in self.schedules.values():
            found.setdefault(schedule.service.name, []).append(schedule)
        return found

    def register(self, *, restart: bool = False) -> None:
        """Give every schedule its row (first tick after now), or restart one whose declaration changed.

        A schedule the service's code no longer declares is marked absent, and one declared
        again after :data:`LONG_ABSENCE` restarts. ``restart`` restarts every schedule at its
        first tick after now (a test's clock jumped). A service whose database is unreachable
        is registered by a later pass; the others are registered now.
        """
        for service, schedules in self.by_service().items():
            self._serve(service, functools.partial(self._register, service, schedules, restart=restart))

    def _register(self, service: str, schedules: list[Schedule], *, restart: bool = False) -> None:
        declared = sorted({s.name for s in schedules} | {s.name for s in schedules[0].service.schedules})
        with self._connection(service) as conn, conn.transaction():
            now = clock.now(conn, service)
            store.mark_absent(conn, service, declared)
            for schedule in schedules:
                next_tick = schedule.timing.next_after(now)
                store.register(
                    conn, service, schedule.name, schedule.spec, next_tick, absence=LONG_ABSENCE, restart=restart
                )
        self._registered.add(service)

    @property
    def registered(self) -> bool:
        """Whether this scheduler has registered the rows of every service's schedules."""
        return self._registered >= set(self.by_service())

    def fire_due(self) -> Counter[str]:
        """Fire every due schedule; return the outcomes counted (``fired``, ``skipped``, ``missed``, ``error``).

        A schedule held back by an unreachable database is not counted: it stays due, and
        the other services' schedules fire.
        """
        done: Counter[str] = Counter()
        self._stalled = set()
        for service, schedules in self.by_service().items():
            self._serve(service, functools.partial(self._fire_service, service, schedules, done))
        return done

    def _fire_service(self, service: str, schedules: list[Schedule], done: Counter[str]) -> None:
        if service not in self._registered:
            self._register(service, schedules)
        with self._connection(service) as conn:
            due = store.due(conn, service, [s.name for s in schedules])
        for name in due:
            done.update(self._fire_isolated(self.schedules[f"{service}.{name}"]))

    def _serve(self, service: str, action: Callable[[], None]) -> None:
        """Run ``action`` on ``service``'s database unless a failure holds it back; never raises a database error.

        An outage holds back the database (every service on it), another database error
        (the schedules table not migrated yet) the service, for a pause that grows while
        it lasts; the caller goes on with the other services.
        """
        database = self.runtime.database(service)
        if self.held.holds(database.dsn) or self.held.holds(service):
            self._stalled.update(s.full_name for s in self.by_service()[service])
            return
        try:
            action()
        except DatabaseUnavailable as exc:
            self.held.failed(database.dsn, f"database {database.description}", exc)
        except DatabaseError as exc:
            not_migrated = isinstance(exc.__cause__, psycopg.errors.UndefinedTable)
            why = "the schedules table is not migrated yet (estafeta migrate)" if not_migrated else exc
            self.held.failed(service, f"service {service}", why)
        else:
            self.held.recovered(database.dsn, f"database {database.description}")
            self.held.recovered(service, f"service {service}")

    @contextlib.contextmanager
    def _connection(self, service: str) -> Iterator[psycopg.Connection[Any]]:
        """A connection to ``service``'s database, waiting briefly for one if it was unreachable last time."""
        database = self.runtime.database(service)
        with database.connection(timeout=self.held.wait(database.dsn)) as conn:
            yield conn

    def _fire_isolated(self, schedule: Schedule) -> Counter[str]:
        try:
            return self.fire(schedule)
        except DatabaseUnavailable:
            raise
        except Exception as exc:
            # This schedule's own failure (its function raised, its command has no step):
            # recorded on its row for an operator, tried again next pass; the others go on.
            logger.exception("schedule %s cannot fire", schedule.full_name)
            self._stalled.add(schedule.full_name)
            self._record_error(schedule, f"error: {type(exc).__name__}: {exc}")
            return Counter(error=1)

    def fire(self, schedule: Schedule) -> Counter[str]:
        """Fire ``schedule``'s due ticks in one transaction; an empty count if none is due or another process has it.

        Also empty while the previous run's fate, which its overlap policy asks, is in an
        unreachable database: the ticks wait, and go by the catch-up policy once it is back.
        """
        service = schedule.service.name
        try:
            previous = self._previous_run(schedule)
        except RunUnknown as exc:
            logger.debug("schedule %s waits: %s", schedule.full_name, exc)
            self._stalled.add(schedule.full_name)
            return Counter()
        with self._connection(service) as conn:
            attempt = store.begin_attempt(conn, service, schedule.name, schedule.spec)
        if attempt is None:
            return Counter()
        with self.runtime.database(service).transaction() as conn:
            row = store.claim_due(conn, service, schedule.name)
            if row is None or row.spec != schedule.spec:
                # Not due, fired by another process now, or declared otherwise by a newer deploy.
                return Counter()
            if previous is not None and previous.message_id != row.last_message_id:
                return Counter()  # fired since its previous run was asked about: asked again next pass
            unfinished = previous.unfinished if previous is not None else None
            firing = plan(conn, schedule, row, unfinished=unfinished, interrupted=attempt.interrupted)
            store.record(conn, service, schedule.name, firing)
        if firing.fired:
            logger.info("schedule %s fired %s", schedule.full_name, firing.outcome)
        return Counter(
            {k: v for k, v in (("fired", firing.fired), ("skipped", firing.skipped), ("missed", firing.missed)) if v}
        )

    def _previous_run(self, schedule: Schedule) -> _Previous | None:
        """For ``overlap="skip"``: the previous run, read before the row is locked (``None``: not asked)."""
        if schedule.overlap is not Overlap.SKIP:
            return None
        service = schedule.service.name
        with self._connection(service) as conn:
            row = store.get(conn, service, schedule.name)
            if row is None:
                return _Previous(None, None)
            status = run_status(self.runtime, conn, service, row, self.held)
        return _Previous(row.last_message_id, status if status in UNFINISHED else None)

    def trigger(self, schedule: Schedule) -> uuid.UUID | None:
        """Fire ``schedule`` once now, outside its ticks (an operator's ``trigger``); return the message id.

        ``None`` if its function sent nothing. Its next tick stays where it was; overlap is
        not checked (the operator asked). Raises :class:`DeclaredOtherwise` if its row runs
        another declaration.
        """
        with self._locked(schedule) as (conn, row):
            sent = send_tick(conn, schedule, row.now, uuid.uuid4())
            firing = store.Firing(
                next_fire_at=row.next_fire_at,
                outcome="triggered by an operator" if sent else "triggered by an operator: nothing to send",
                fired=1 if sent else 0,
                last_tick=row.now if sent else None,
                last_message_id=sent[0] if sent else None,
                last_actor=sent[1] if sent else None,
            )
            store.record(conn, schedule.service.name, schedule.name, firing, keep_attempt=True)
        return sent[0] if sent else None

    def set_paused(self, schedule: Schedule, *, paused: bool) -> bool:
        """Pause ``schedule`` (no tick fires), or resume it from its first tick after now; whether it changed.

        Ticks that fell while it was paused are not caught up: a pause is an operator's
        decision that they should not fire. Pausing a paused schedule or resuming one that
        is not paused changes nothing (``False``): a due tick still fires. Raises
        :class:`DeclaredOtherwise` if its row runs another declaration.
        """
        with self._locked(schedule) as (conn, row):
            if row.paused == paused:
                return False
            resume_at = None if paused else schedule.timing.next_after(row.now)
            outcome = "paused by an operator" if paused else "resumed by an operator"
            store.set_paused(
                conn, schedule.service.name, schedule.name, paused=paused, outcome=outcome, next_fire_at=resume_at
            )
        return True

    @contextlib.contextmanager
    def _locked(self, schedule: Schedule) -> Iterator[tuple[psycopg.Connection[Any], store.ScheduleRow]]:
        """``schedule``'s row, locked in a transaction of its service's database (created if it has none).

        An existing row is never re-declared: one that runs another spec than this code's
        raises :class:`DeclaredOtherwise` (an operator's checkout must not rewrite it).
        """
        service = schedule.service.name
        with self.runtime.database(service).transaction() as conn:
            first_tick = schedule.timing.next_after(clock.now(conn, service))
            store.create(conn, service, schedule.name, schedule.spec, first_tick)
            row = store.lock(conn, service, schedule.name)
            assert row is not None, "created just before"
            if row.spec != schedule.spec:
                raise DeclaredOtherwise(
                    f"schedule {schedule.full_name} runs as {row.spec!r} but this checkout declares"
                    f" {schedule.spec!r}: run the command from the deployed code"
                )
            yield conn, row

    def _record_error(self, schedule: Schedule, error: str) -> None:
        service = schedule.service.name
        try:
            with self.runtime.database(service).transaction() as conn:
                row = store.lock(conn, service, schedule.name)
                if row is not None:
                    store.record(
                        conn, service, schedule.name, store.Firing(next_fire_at=row.next_fire_at, outcome=error)
                    )
        except DatabaseError:
            logger.exception("schedule %s: cannot record its error", schedule.full_name)

    def states(self) -> list[ScheduleState]:
        """What an operator sees of each schedule (read only: a schedule no process registered has no row).

        A service whose database is unreachable shows its schedules as such, and a last run
        whose step's database is unreachable as ``unknown``; the others are read.
        """
        held = HeldBack(report=False)  # one wait per unreachable database, not one per schedule
        found: list[ScheduleState] = []
        for service, schedules in self.by_service().items():
            try:
                with self.runtime.database(service).connection(timeout=HANDLER_WAIT) as conn:
                    rows = {r.name: r for r in store.list_all(conn, service)}
                    found += [self._state(conn, s, rows.get(s.name), held) for s in schedules]
            except DatabaseUnavailable as exc:
                found += [ScheduleState(s, None, None, unreachable=str(exc)) for s in schedules]
        return found

    def _state(
        self, conn: psycopg.Connection[Any], schedule: Schedule, row: store.ScheduleRow | None, held: HeldBack
    ) -> ScheduleState:
        try:
            last_run = None if row is None else run_status(self.runtime, conn, schedule.service.name, row, held)
        except RunUnknown as exc:
            last_run = f"unknown: {exc}"
        return ScheduleState(schedule, row, last_run)

    def seconds_to_next(self) -> float | None:
        """Seconds until the next tick of any schedule that can fire (``None``: none runs).

        Schedules held back by an unreachable database, or whose last pass failed, are left out.
        """
        found: list[float] = []
        for service, schedules in self.by_service().items():
            names = [s.name for s in schedules if s.full_name not in self._stalled]
            if names:
                self._serve(service, functools.partial(self._seconds_to_next, service, names, found))
        return min(found, default=None)

    def _seconds_to_next(self, service: str, names: list[str], found: list[float]) -> None:
        with self._connection(service) as conn:
            seconds = store.seconds_to_next(conn, service, names)
        if seconds is not None:
            found.append(seconds)

    def run(self, stop: threading.Event, interval: float = 1.0) -> None:
        """Fire due ticks until ``stop`` is set, waking at the next tick (at least every ``interval`` s); never dies.

        A failure of one database or service holds back only its schedules (:class:`HeldBack`).
        """
        pause = interval
        registered_at = time.monotonic()
        while not stop.is_set():
            try:
                if time.monotonic() - registered_at > REGISTER_AGAIN_SECONDS:
                    # A row another deploy declared otherwise is left alone by fire(); this
                    # makes it this process's again, so a rolling deploy that changed a
                    # schedule ends with the new timing once the old workers are gone.
                    self.register()
                    registered_at = time.monotonic()
                self.fire_due()
                upcoming = self.seconds_to_next()
                wait = interval if upcoming is None else min(max(upcoming, 0.01), interval)
                pause = interval
            except Exception:
                # Neither one schedule's error (recorded on its row) nor a database's outage
                # (held back by database): still, never die.
                pause = wait = min(max(pause * 2, interval), 30.0)
                logger.exception("scheduler paused %.1fs by an unexpected error", wait)
            stop.wait(wait)


class SchedulerMiddleware(WorkerThread):
    """Runs a :class:`Scheduler` thread in each worker process, from boot to shutdown."""

    thread_name = "estafeta-scheduler"

    def __init__(self, runtime: Runtime, schedules: Sequence[Schedule]) -> None:
        super().__init__()
        self.runtime = runtime
        self.schedules = list(schedules)

    def run(self, stop: threading.Event) -> None:
        Scheduler(self.runtime, self.schedules).run(stop)
