"""Firing recurring schedules: each tick once, whichever worker processes run and crash.

Every ``dramatiq`` worker process of an app with schedules runs a :class:`Scheduler`
pass about once a second (:class:`SchedulerMiddleware`), and ``estafeta.testing``'s
virtual clock runs one after each move. A pass fires each due schedule in one
transaction of its service's database:

1. lock the schedule's row if its ``next_fire_at`` has come (``FOR UPDATE SKIP LOCKED``:
   another process firing it is skipped, never waited for);
2. choose the ticks to fire by the catch-up policy, and drop those the overlap policy
   skips;
3. write each tick's command to the service's outbox, with a message id derived from
   the schedule and the tick;
4. move ``next_fire_at`` past the ticks handled and record the outcome on the row.

The commit makes all of it or none of it: a process killed before the commit fired
nothing (the next pass, in any process, fires the tick), and after the commit the tick
is no longer due anywhere. The relay publishes the command like any other outbox row;
the receiving step's inbox absorbs a re-publish. A schedule whose function raises is
recorded on its row and tried again next pass; the other schedules go on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

import attrs
import psycopg
import psycopg.errors

from sql import clock
from sql import schedule_store as store
from sql.errors import DatabaseError, DatabaseUnavailable

from . import _outbox as outbox
from ._errors import RoutingError
from ._middleware import WorkerThread
from ._runtime import Runtime
from ._schedule_spec import CatchUp, Overlap, Schedule

logger = logging.getLogger(__name__)

#: At most this many missed ticks are fired by one transaction (catch-up ``all``); the rest next pass.
MAX_TICKS_PER_FIRING = 100
#: Seconds between a worker's registrations of its schedules (see :meth:`Scheduler.run`).
REGISTER_AGAIN_SECONDS = 60.0
#: Missed ticks counted one by one under ``last`` and ``none``; past it, the count says "at least".
MAX_TICKS_COUNTED = 10_000


class Scheduler:
    """Fires the due ticks of ``schedules``, one transaction per schedule."""

    def __init__(self, runtime: Runtime, schedules: Iterable[Schedule]) -> None:
        self.runtime = runtime
        #: The schedules fired, by ``service.name``.
        self.schedules = {s.full_name: s for s in schedules}
        self._registered = False

    def by_service(self) -> dict[str, list[Schedule]]:
        """The schedules grouped by the service that owns them."""
        found: dict[str, list[Schedule]] = {}
        for schedule in self.schedules.values():
            found.setdefault(schedule.service.name, []).append(schedule)
        return found

    def register(self, *, restart: bool = False) -> None:
        """Give every schedule its row (first tick after now), or restart one whose declaration changed.

        ``restart`` restarts every schedule at its first tick after now (a test's clock jumped).
        """
        for service, schedules in self.by_service().items():
            with self.runtime.database(service).transaction() as conn:
                now = clock.now(conn, service)
                for schedule in schedules:
                    next_tick = schedule.timing.next_after(now)
                    store.register(conn, service, schedule.name, schedule.spec, next_tick, restart=restart)
        self._registered = True

    @property
    def registered(self) -> bool:
        """Whether this scheduler has registered its schedules' rows."""
        return self._registered

    def fire_due(self) -> Counter[str]:
        """Fire every due schedule; return the outcomes counted (``fired``, ``skipped``, ``missed``, ``error``).

        Raises :class:`DatabaseUnavailable` after the other services had their turn when
        one service's database is unreachable.
        """
        if not self._registered:
            self.register()
        done: Counter[str] = Counter()
        outage: DatabaseUnavailable | None = None
        for service, schedules in self.by_service().items():
            try:
                with self.runtime.database(service).connection() as conn:
                    due = store.due(conn, service, [s.name for s in schedules])
                for name in due:
                    done.update(self._fire_isolated(self.schedules[f"{service}.{name}"]))
            except DatabaseUnavailable as exc:
                outage = outage or exc
        if outage is not None:
            raise outage
        return done

    def _fire_isolated(self, schedule: Schedule) -> Counter[str]:
        try:
            return self.fire(schedule)
        except DatabaseUnavailable:
            raise
        except Exception as exc:
            # This schedule's own failure (its function raised, its command has no step):
            # recorded on its row for an operator, tried again next pass; the others go on.
            logger.exception("schedule %s cannot fire", schedule.full_name)
            self._record_error(schedule, f"error: {type(exc).__name__}: {exc}")
            return Counter(error=1)

    def fire(self, schedule: Schedule) -> Counter[str]:
        """Fire ``schedule``'s due ticks in one transaction; an empty count if none is due or another process has it."""
        service = schedule.service.name
        with self.runtime.database(service).transaction() as conn:
            row = store.claim_due(conn, service, schedule.name)
            if row is None or row.spec != schedule.spec:
                # Not due, fired by another process now, or declared otherwise by a newer deploy.
                return Counter()
            firing = self._plan(conn, schedule, row)
            store.record(conn, service, schedule.name, firing)
        if firing.fired:
            logger.info("schedule %s fired %s", schedule.full_name, firing.outcome)
        return Counter(
            {k: v for k, v in (("fired", firing.fired), ("skipped", firing.skipped), ("missed", firing.missed)) if v}
        )

    def _plan(self, conn: psycopg.Connection[Any], schedule: Schedule, row: store.ScheduleRow) -> store.Firing:
        ticks, missed, more, next_fire_at = _choose_ticks(schedule, row)
        # The overlap policy's question, asked once: the runs fired below are unfinished by definition.
        previous = run_status(self.runtime, conn, schedule.service.name, row) if ticks else None
        unfinished = schedule.overlap is Overlap.SKIP and previous in UNFINISHED
        fired = skipped = 0
        last: tuple[datetime, uuid.UUID, str] | None = None
        for tick in ticks:
            if unfinished:
                skipped += 1
                continue
            sent = _send_tick(conn, schedule, tick, schedule.tick_message_id(tick))
            if sent is not None:
                fired += 1
                last = (tick, *sent)
                unfinished, previous = schedule.overlap is Overlap.SKIP, "fired in the same pass"
        outcome = _describe(fired, skipped, missed, more, last[0] if last else None, previous)
        return store.Firing(
            next_fire_at=next_fire_at,
            outcome=outcome,
            fired=fired,
            skipped=skipped,
            missed=missed,
            last_tick=last[0] if last else None,
            last_message_id=last[1] if last else None,
            last_actor=last[2] if last else None,
        )

    def trigger(self, schedule: Schedule) -> uuid.UUID | None:
        """Fire ``schedule`` once now, outside its ticks (an operator's ``trigger``); return the message id.

        ``None`` if its function sent nothing.

        Its next tick stays where it was; overlap is not checked (the operator asked).
        """
        with self._locked(schedule) as (conn, row):
            sent = _send_tick(conn, schedule, row.now, uuid.uuid4())
            firing = store.Firing(
                next_fire_at=row.next_fire_at,
                outcome="triggered by an operator" if sent else "triggered by an operator: nothing to send",
                fired=1 if sent else 0,
                last_tick=row.now if sent else None,
                last_message_id=sent[0] if sent else None,
                last_actor=sent[1] if sent else None,
            )
            store.record(conn, schedule.service.name, schedule.name, firing)
        return sent[0] if sent else None

    def set_paused(self, schedule: Schedule, *, paused: bool) -> None:
        """Pause ``schedule`` (no tick fires), or resume it from its first tick after now.

        Ticks that fell while it was paused are not caught up: a pause is an operator's
        decision that they should not fire.
        """
        with self._locked(schedule) as (conn, row):
            resume_at = None if paused else schedule.timing.next_after(row.now)
            outcome = "paused by an operator" if paused else "resumed by an operator"
            store.set_paused(
                conn, schedule.service.name, schedule.name, paused=paused, outcome=outcome, next_fire_at=resume_at
            )

    @contextlib.contextmanager
    def _locked(self, schedule: Schedule) -> Iterator[tuple[psycopg.Connection[Any], store.ScheduleRow]]:
        """``schedule``'s row, locked in a transaction of its service's database (registered first if need be)."""
        if not self._registered:
            self.register()
        service = schedule.service.name
        with self.runtime.database(service).transaction() as conn:
            row = store.lock(conn, service, schedule.name)
            assert row is not None, "registered just before"
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
        """What an operator sees of each schedule (read only: a schedule no process registered has no row)."""
        found: list[ScheduleState] = []
        for service, schedules in self.by_service().items():
            with self.runtime.database(service).connection() as conn:
                rows = {r.name: r for r in store.list_all(conn, service)}
                for schedule in schedules:
                    row = rows.get(schedule.name)
                    last_run = None if row is None else run_status(self.runtime, conn, service, row)
                    found.append(ScheduleState(schedule, row, last_run))
        return found

    def seconds_to_next(self) -> float | None:
        """Seconds until the next tick of any schedule (``None``: none runs)."""
        found: list[float] = []
        for service, schedules in self.by_service().items():
            with self.runtime.database(service).connection() as conn:
                seconds = store.seconds_to_next(conn, service, [s.name for s in schedules])
            if seconds is not None:
                found.append(seconds)
        return min(found, default=None)

    def run(self, stop: threading.Event, interval: float = 1.0) -> None:
        """Fire due ticks until ``stop`` is set, waking at the next tick (at least every ``interval`` s); never dies."""
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
            except DatabaseError as exc:
                pause = wait = min(max(pause * 2, interval), 30.0)
                if isinstance(exc.__cause__, psycopg.errors.UndefinedTable):
                    logger.info("scheduler idle: the schedules tables are not migrated yet (estafeta migrate)")
                else:
                    logger.warning("scheduler paused %.1fs: %s", wait, exc)
            except Exception:
                pause = wait = min(max(pause * 2, interval), 30.0)
                logger.exception("scheduler paused %.1fs by an unexpected error", wait)
            stop.wait(wait)


@attrs.frozen
class ScheduleState:
    """A schedule as an operator sees it: its declaration, its row, and what became of its last run."""

    schedule: Schedule
    #: ``None`` until a worker process (or an operator's command) registered it.
    row: store.ScheduleRow | None
    #: :func:`run_status` of the last firing's message.
    last_run: str | None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``str`` for times and ids): what ``estafeta schedules list --json`` prints."""
        row, schedule = self.row, self.schedule
        return {
            "name": schedule.full_name,
            "spec": schedule.spec,
            "overlap": schedule.overlap.value,
            "catch_up": schedule.catch_up.value,
            "registered": row is not None,
            "paused": bool(row and row.paused),
            "next_fire_at": None if row is None or row.paused else row.next_fire_at,
            "last_tick": row and row.last_tick,
            "last_fired_at": row and row.last_fired_at,
            "last_message_id": row and row.last_message_id,
            "last_run": self.last_run,
            "last_outcome": row and row.last_outcome,
            "last_outcome_at": row and row.last_outcome_at,
            "fired": row.fired if row else 0,
            "skipped": row.skipped if row else 0,
            "missed": row.missed if row else 0,
        }


#: What :func:`run_status` says of a run that is not finished.
UNFINISHED = frozenset({"waiting to be published", "publish failed", "published, not processed yet"})


def run_status(runtime: Runtime, conn: psycopg.Connection[Any], service: str, row: store.ScheduleRow) -> str | None:
    """What became of the message the last firing sent: ``None`` if none was sent.

    ``waiting to be published`` or ``publish failed`` while it is in the outbox,
    ``processed`` once its step committed, ``dead-lettered`` once parked, else
    ``published, not processed yet``. A run older than the inbox's retention counts as
    ``forgotten`` (finished): its inbox record may be pruned. ``conn`` is on ``service``'s database.
    """
    if row.last_message_id is None or row.last_actor is None or row.last_fired_at is None:
        return None
    if row.last_fired_at < row.now - runtime.settings.inbox_retention:
        return "forgotten"
    status = store.outbox_status(conn, service, row.last_message_id)
    if status is not None:
        return "publish failed" if status == "failed" else "waiting to be published"
    handler = row.last_actor.split(".", 1)[0]
    database = runtime.database(handler)
    if database is runtime.database(service):
        handled = store.handled(conn, handler, row.last_actor, row.last_message_id)
    else:
        with database.connection() as other:
            handled = store.handled(other, handler, row.last_actor, row.last_message_id)
    return handled or "published, not processed yet"


def _choose_ticks(schedule: Schedule, row: store.ScheduleRow) -> tuple[list[datetime], int, bool, datetime]:
    """The due ticks the catch-up policy fires, how many it misses, whether more remain, and the next tick.

    ``ALL`` fires up to a batch (the rest next pass). ``LAST`` and ``NONE`` count the due
    ticks forward from ``next_fire_at`` (up to :data:`MAX_TICKS_COUNTED`; the latest is
    then found backwards), so the tick fired is never one before ``next_fire_at``.
    """
    if schedule.catch_up is CatchUp.ALL:
        ticks, more = schedule.due_ticks(row.next_fire_at, row.now, MAX_TICKS_PER_FIRING)
        return ticks, 0, more, schedule.timing.next_after(ticks[-1])
    counted, beyond = schedule.due_ticks(row.next_fire_at, row.now, MAX_TICKS_COUNTED)
    latest = max(schedule.timing.latest_through(row.now), counted[-1]) if beyond else counted[-1]
    fired = [] if schedule.catch_up is CatchUp.NONE and row.now - latest > schedule.grace else [latest]
    missed = len(counted) - (1 if fired and latest == counted[-1] else 0)
    return fired, missed, beyond, schedule.timing.next_after(row.now)


def _send_tick(
    conn: psycopg.Connection[Any], schedule: Schedule, tick: datetime, message_id: uuid.UUID
) -> tuple[uuid.UUID, str] | None:
    """Write the command for ``tick`` to the outbox in ``conn``'s transaction; return (its id, its step).

    ``None`` if the schedule's function sends nothing for this tick.
    """
    command = schedule(tick)
    if command is None:
        return None
    service = schedule.service
    handlers = service.router.handlers(type(command))
    if len(handlers) != 1:
        names = ", ".join(h.actor_name for h in handlers) or "none"
        raise RoutingError(
            f"schedule {schedule.full_name} sends {type(command).__name__},"
            f" which needs exactly one step handling it (found: {names})"
        )
    options = {"estafeta_schedule": schedule.full_name, "estafeta_tick": tick.isoformat()}
    outbox.send(conn, command, service=service.name, router=service.router, message_id=message_id, options=options)
    return message_id, handlers[0].actor_name


def _describe(
    fired: int, skipped: int, missed: int, more: bool, last_tick: datetime | None, previous: str | None
) -> str:
    parts = []
    if fired:
        parts.append(f"fired {fired} tick{'s' if fired > 1 else ''} (last {last_tick:%Y-%m-%d %H:%M:%S %Z})")
    if skipped:
        parts.append(f"skipped {skipped}: the previous run is unfinished ({previous})")
    if missed:
        parts.append(f"missed {missed}{'+' if more else ''} by the catch-up policy")
    return "; ".join(parts) or "nothing to send"


class SchedulerMiddleware(WorkerThread):
    """Runs a :class:`Scheduler` thread in each worker process, from boot to shutdown."""

    thread_name = "estafeta-scheduler"

    def __init__(self, runtime: Runtime, schedules: Sequence[Schedule]) -> None:
        super().__init__()
        self.runtime = runtime
        self.schedules = list(schedules)

    def run(self, stop: threading.Event) -> None:
        Scheduler(self.runtime, self.schedules).run(stop)
