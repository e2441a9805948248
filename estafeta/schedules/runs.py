"""What became of the run a schedule's last firing sent, and a schedule as an operator sees it.

The overlap policy ``skip`` asks it before a tick fires, and ``estafeta schedules list``
and the console show it. The message is first looked for in the schedule's own outbox;
once published, in the inbox and dead letters of the step that got it, which may live in
another database. That database is asked outside any row lock, waiting at most
:data:`HANDLER_WAIT` seconds for a connection, and never while a :class:`HeldBack` holds
it: an unreachable one makes the run's fate unknown (:class:`RunUnknown`), not an outage
of the schedule's own service.
"""

from __future__ import annotations

from typing import Any

import attrs
import psycopg

from estafeta.app.runtime import Runtime
from estafeta.schedules.holds import HeldBack
from estafeta.schedules.spec import Schedule
from estafeta_sql import schedule_store as store
from estafeta_sql.errors import DatabaseUnavailable
from estafeta_sql.pool import Database

#: Seconds to wait for a connection to the database of the step that got a schedule's last run.
HANDLER_WAIT = 2.0
#: What :func:`run_status` says of a run that is not finished.
UNFINISHED = frozenset({"waiting to be published", "publish failed", "published, not processed yet"})


class RunUnknown(Exception):
    """What became of a schedule's last run is in a database that is unreachable now."""


def run_status(
    runtime: Runtime,
    conn: psycopg.Connection[Any],
    service: str,
    row: store.ScheduleRow,
    held: HeldBack | None = None,
) -> str | None:
    """What became of the message the last firing sent: ``None`` if none was sent.

    ``waiting to be published`` or ``publish failed`` while it is in the outbox,
    ``processed`` once its step committed, ``dead-lettered`` once parked, else
    ``published, not processed yet``. A run older than the inbox's retention counts as
    ``forgotten`` (finished): its inbox record may be pruned. ``conn`` is on ``service``'s
    database. Raises :class:`RunUnknown` if the step's database (another one) is
    unreachable or held back by ``held``, which learns what was found.
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
        handled = _handled_elsewhere(database, handler, row, held or HeldBack(report=False))
    return handled or "published, not processed yet"


def _handled_elsewhere(database: Database, handler: str, row: store.ScheduleRow, held: HeldBack) -> str | None:
    assert row.last_actor is not None and row.last_message_id is not None
    what = f"the database of {handler} ({database.description})"
    if held.holds(database.dsn):
        raise RunUnknown(f"{what} is unreachable")
    try:
        with database.connection(timeout=HANDLER_WAIT) as other:
            handled = store.handled(other, handler, row.last_actor, row.last_message_id)
    except DatabaseUnavailable as exc:
        held.failed(database.dsn, what, exc)
        raise RunUnknown(f"{what} is unreachable") from exc
    held.recovered(database.dsn, what)
    return handled


@attrs.frozen
class ScheduleState:
    """A schedule as an operator sees it: its declaration, its row, and what became of its last run."""

    schedule: Schedule
    #: ``None`` until a worker process (or an operator's command) registered it, or while unreachable.
    row: store.ScheduleRow | None
    #: :func:`run_status` of the last firing's message (``unknown: ...`` if it cannot be read now).
    last_run: str | None
    #: Why its row cannot be read now (its service's database is unreachable); ``None``: it was read.
    unreachable: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``str`` for times and ids): what ``estafeta schedules list --json`` prints."""
        row, schedule = self.row, self.schedule
        return {
            "name": schedule.full_name,
            "spec": schedule.spec,
            "overlap": schedule.overlap.value,
            "catch_up": schedule.catch_up.value,
            "registered": None if self.unreachable else row is not None,
            "unreachable": self.unreachable,
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
