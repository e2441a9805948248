"""Operating projections: status, lag metrics, and side-by-side rebuilds.

A rebuild fills a second copy of the projection's tables, under the same names in a schema
of its own (so that their indexes and constraints are named as the live ones are), from the
start of the log while the live projection keeps answering and keeps following the log.
Once the copy has caught up, one transaction switches over: it takes the live checkpoint's
lock (waiting for the live projector's batch in flight, and holding its next one), applies
the last events to the copy, drops the live tables, moves the copy into their schema and
hands the copy's checkpoint to the live projection. Readers see the old tables until that
commit and the new ones after it; the live projector carries on from the copy's checkpoint
on the new tables. Objects users built on the live tables (views, foreign keys) would be
lost with them: a rebuild refuses to start, or to switch over, while any exist, and names them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import attrs
import psycopg
import psycopg.errors
from prometheus_client import Counter, Gauge
from psycopg import sql

from estafeta.events.projections import BatchResult, Projection, Projector, lock_key
from estafeta.events.store import EventStore
from estafeta_sql import projection_store
from estafeta_sql.errors import EstafetaError

logger = logging.getLogger(__name__)

APPLIED = Counter("estafeta_projection_events_applied", "Events applied to a projection", ["schema", "projection"])
BAD_EVENTS = Counter(
    "estafeta_projection_bad_events", "Events a projection could not apply", ["schema", "projection", "outcome"]
)
LAG_EVENTS = Gauge("estafeta_projection_lag_events", "Events in the log not yet applied", ["schema", "projection"])
LAG_SECONDS = Gauge(
    "estafeta_projection_lag_seconds", "Age of the oldest event not yet applied", ["schema", "projection"]
)
OLDEST_WRITER_AGE = Gauge(
    "estafeta_projection_oldest_writer_age_seconds",
    "Age of the oldest running writing transaction on the server of the schema's database,"
    " which holds back every projector on that server",
    ["schema"],
)


class RebuildError(EstafetaError):
    """The rebuild could not finish; the live projection is untouched."""


def observe_batch(projector: Projector, result: BatchResult) -> None:
    """Count what a batch did (applied events, bad events)."""
    labels = (projector.schema, projector.checkpoint_name)
    if result.applied:
        APPLIED.labels(*labels).inc(result.applied)
    if result.skipped:
        BAD_EVENTS.labels(*labels, "skipped").inc(result.skipped)
    if result.failed is not None:
        BAD_EVENTS.labels(*labels, "stopped").inc()


def refresh_lag(conn: psycopg.Connection[Any], projector: Projector, after: tuple[int, int]) -> None:
    """Set the lag gauges of ``projector`` (and the oldest writer's age) from the database."""
    events, seconds = projection_store.lag(conn, projector.schema, after)
    LAG_EVENTS.labels(projector.schema, projector.checkpoint_name).set(events)
    LAG_SECONDS.labels(projector.schema, projector.checkpoint_name).set(seconds)
    # Per schema: services on separate servers have separate transaction ids, and one
    # server's long writer holds back only the projectors on that server.
    writer = projection_store.oldest_writer(conn)
    OLDEST_WRITER_AGE.labels(projector.schema).set(writer.age_seconds if writer else 0.0)


@attrs.frozen
class ProjectionStatus:
    """Where a projection is, how far behind, and whether a projector runs it."""

    name: str
    #: ``running`` (a projector holds it), ``stopped`` (none does), ``failed`` or ``rebuilding``.
    state: str
    position: int
    tx_id: int
    events_applied: int
    #: Committed events not applied yet (counted up to ``LAG_COUNT_CAP``).
    lag_events: int
    #: Age of the next event to apply; 0 when caught up.
    lag_seconds: float
    #: The pid of the projector (or rebuild) holding the projection.
    projector_pid: int | None
    last_error: str | None
    error_position: int | None
    updated_at: datetime | None


def projection_status(conn: psycopg.Connection[Any], schema: str) -> list[ProjectionStatus]:
    """Every projection of ``schema`` (rebuilds in progress included), by name."""
    found = []
    for checkpoint in projection_store.list_checkpoints(conn, schema):
        events, seconds = projection_store.lag(conn, schema, checkpoint.after)
        pid = projection_store.lock_holder(conn, lock_key(schema, checkpoint.projection))
        state = checkpoint.state if checkpoint.state != "running" else "running" if pid else "stopped"
        found.append(
            ProjectionStatus(
                checkpoint.projection,
                state,
                checkpoint.position,
                checkpoint.tx_id,
                checkpoint.events_applied,
                events,
                seconds if events else 0.0,
                pid,
                checkpoint.last_error,
                checkpoint.error_position,
                checkpoint.updated_at,
            )
        )
    return found


@attrs.frozen
class RebuildResult:
    """What a rebuild did."""

    events_applied: int
    seconds: float
    #: Switch-over attempts (a reader holding a live table past the lock timeout costs one).
    attempts: int


Progress = Callable[[int, int], None]


def rebuild(
    dsn: str,
    projection: Projection,
    store: EventStore,
    *,
    batch_size: int = 1000,
    progress: Progress | None = None,
    lock_timeout: float = 5.0,
    attempts: int = 5,
) -> RebuildResult:
    """Rebuild ``projection`` side by side from the start of the log, then switch over (see the module doc).

    ``progress(done, total)`` is called after every batch (``total``: events in the log at
    the start). Raises :class:`RebuildError` if another rebuild of it runs, if it fails on
    a bad event, or if the switch-over cannot get its locks; the copy is then dropped and
    the live projection is untouched.
    """
    builder = Projector(projection, store, batch_size=batch_size, rebuild=True)
    live = Projector(projection, store, batch_size=batch_size)
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True, application_name=f"estafeta-rebuild:{projection.name}") as conn:
        row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (builder.lock_key,)).fetchone()
        if not (row and row[0]):
            holder = projection_store.lock_holder(conn, builder.lock_key)
            raise RebuildError(f"a rebuild of {projection.name} is already running (pid {holder})")
        _refuse_dependents(conn, live)  # before hours of work, not only at the switch-over
        try:
            with conn.transaction():
                builder.drop_tables(conn)  # a copy left by an earlier, interrupted rebuild
                builder.create_tables(conn)
            applied = _fill(conn, builder, _log_size(conn, store.schema), progress)
            applied, tries = _switch_over(conn, builder, live, applied, lock_timeout, attempts)
        except BaseException:
            with conn.transaction():
                builder.drop_tables(conn)
            raise
    return RebuildResult(applied, time.monotonic() - started, tries)


def _log_size(conn: psycopg.Connection[Any], schema: str) -> int:
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}.events").format(sql.Identifier(schema))).fetchone()
    return int(row[0]) if row else 0


def _fill(conn: psycopg.Connection[Any], builder: Projector, total: int, progress: Progress | None) -> int:
    """Apply batches to the copy until it has caught up with the safe end of the log."""
    done = applied = 0
    while True:
        result = builder.run_batch(conn)
        if result.failed is not None:
            raise RebuildError(f"rebuild of {builder.projection.name} stopped: {result.failed}")
        done, applied = done + result.read, applied + result.applied
        if progress is not None:
            progress(done, max(total, done))
        if not result.more:
            return applied


def _switch_over(
    conn: psycopg.Connection[Any], builder: Projector, live: Projector, applied: int, timeout: float, attempts: int
) -> tuple[int, int]:
    for attempt in range(1, attempts + 1):
        try:
            with conn.transaction():
                conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{int(timeout * 1000)}ms",))
                projection_store.ensure_checkpoint(conn, live.schema, live.checkpoint_name)
                projection_store.lock_checkpoint(conn, live.schema, live.checkpoint_name)
                last = _fill(conn, builder, 0, None)
                _swap_tables(conn, builder, live)
                projection_store.adopt_checkpoint(conn, live.schema, live.checkpoint_name, builder.checkpoint_name)
            applied += last  # counted once committed: a rolled-back attempt's events are applied again below
            logger.info("projection %s rebuilt: %d events; switched over", live.checkpoint_name, applied)
            return applied, attempt
        except psycopg.errors.LockNotAvailable as exc:
            logger.warning(
                "rebuild of %s: switch-over attempt %d waited too long for a lock: %s",
                live.checkpoint_name,
                attempt,
                exc.diag.message_primary,
            )
            applied += _fill(conn, builder, 0, None)
    raise RebuildError(
        f"rebuild of {live.checkpoint_name}: could not switch over in {attempts} attempts (readers or a projector"
        f" held its tables for more than {timeout:g} s each time)"
    )


def _swap_tables(conn: psycopg.Connection[Any], builder: Projector, live: Projector) -> None:
    """Drop the live tables, never what depends on them, and move the copy (indexes, constraints...) in their place."""
    _refuse_dependents(conn, live)
    tables = sql.SQL(", ").join(live.table(name) for name in live.projection.tables)
    try:
        # No CASCADE: a dependent the check above cannot see stops the switch-over too.
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(tables))
    except psycopg.errors.DependentObjectsStillExist as exc:
        blockers = (exc.diag.message_detail or exc.diag.message_primary or "").splitlines()
        raise RebuildError(_blocked(live, blockers)) from None
    for name in builder.projection.tables:
        conn.execute(sql.SQL("ALTER TABLE {} SET SCHEMA {}").format(builder.table(name), sql.Identifier(live.schema)))
    conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(builder.table_schema)))  # now empty


def _refuse_dependents(conn: psycopg.Connection[Any], live: Projector) -> None:
    """Raise :class:`RebuildError` naming the views, foreign keys... that depend on the live tables, if any."""
    tables = [live.table(name).as_string(None) for name in live.projection.tables]
    blockers = projection_store.dependents(conn, tables)
    if blockers:
        raise RebuildError(_blocked(live, blockers))


def _blocked(live: Projector, blockers: list[str]) -> str:
    return (
        f"rebuild of {live.checkpoint_name} refused: the switch-over would drop what depends on its tables"
        f" ({'; '.join(blockers)}); drop them, rebuild, then create them again on the new tables"
    )
