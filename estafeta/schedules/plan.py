"""What one firing of a due schedule does: which ticks it fires, skips and misses, and the commands it writes.

:func:`plan` runs inside the firing transaction of :mod:`estafeta.schedules.scheduler`, on the
schedule's locked row; it reads no other database (the overlap policy's question about
the previous run was asked before the lock).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import psycopg

from estafeta.app.errors import RoutingError
from estafeta.messaging import outbox as outbox
from estafeta.schedules.spec import CatchUp, Overlap, Schedule
from estafeta_sql import schedule_store as store

#: At most this many missed ticks are fired by one transaction (catch-up ``all``); the rest next pass.
MAX_TICKS_PER_FIRING = 100
#: Missed ticks counted one by one under ``last`` and ``none``; past it, the count says "at least".
MAX_TICKS_COUNTED = 10_000


def plan(
    conn: psycopg.Connection[Any],
    schedule: Schedule,
    row: store.ScheduleRow,
    *,
    unfinished: str | None,
    interrupted: datetime | None,
) -> store.Firing:
    """Fire ``schedule``'s due ticks on its locked ``row``, in ``conn``'s transaction; what to record.

    ``unfinished``: the previous run's status if the overlap policy skips ticks while it
    runs (``None``: fire). ``interrupted``: the tick an earlier pass began to fire and never
    committed, fired under catch-up ``last`` with the latest.
    """
    ticks, missed, more, next_fire_at = choose_ticks(schedule, row, interrupted)
    fired = skipped = 0
    last: tuple[datetime, uuid.UUID, str] | None = None
    for tick in ticks:
        if unfinished is not None:
            skipped += 1
            continue
        sent = send_tick(conn, schedule, tick, schedule.tick_message_id(tick))
        if sent is not None:
            fired += 1
            last = (tick, *sent)
            # The run fired now is unfinished by definition.
            unfinished = "fired in the same pass" if schedule.overlap is Overlap.SKIP else None
    return store.Firing(
        next_fire_at=next_fire_at,
        outcome=_describe(fired, skipped, missed, more, last[0] if last else None, unfinished),
        fired=fired,
        skipped=skipped,
        missed=missed,
        last_tick=last[0] if last else None,
        last_message_id=last[1] if last else None,
        last_actor=last[2] if last else None,
    )


def choose_ticks(
    schedule: Schedule, row: store.ScheduleRow, interrupted: datetime | None = None
) -> tuple[list[datetime], int, bool, datetime]:
    """The due ticks the catch-up policy fires, how many it misses, whether more remain, and the next tick.

    ``ALL`` fires up to a batch (the rest next pass). ``LAST`` and ``NONE`` count the due
    ticks forward from ``next_fire_at`` (up to :data:`MAX_TICKS_COUNTED`; the latest is
    then found backwards), so the tick fired is never one before ``next_fire_at``. ``LAST``
    also fires ``interrupted`` if it is the first due tick: a firing of it began and never
    committed (its worker was killed), and the next pass in any worker fires it.
    """
    if schedule.catch_up is CatchUp.ALL:
        ticks, more = schedule.due_ticks(row.next_fire_at, row.now, MAX_TICKS_PER_FIRING)
        return ticks, 0, more, schedule.timing.next_after(ticks[-1])
    counted, beyond = schedule.due_ticks(row.next_fire_at, row.now, MAX_TICKS_COUNTED)
    latest = max(schedule.timing.latest_through(row.now), counted[-1]) if beyond else counted[-1]
    fired = [] if schedule.catch_up is CatchUp.NONE and row.now - latest > schedule.grace else [latest]
    if schedule.catch_up is CatchUp.LAST and interrupted == counted[0] and interrupted < latest:
        fired.insert(0, interrupted)
    missed = len(counted) - len(set(fired) & set(counted))
    return fired, missed, beyond, schedule.timing.next_after(row.now)


def send_tick(
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
