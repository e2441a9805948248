"""Retention: what the messaging tables and saga logs keep, and pruning the rest.

The inbox, the delivery counts, the dead letters, the fence rows and the logs of ended
sagas would grow forever. :func:`prune` deletes what is older than its retention, a
batch at a time in short transactions, skipping rows someone holds; ``estafeta prune``
runs it once, and every worker process runs it periodically (:class:`PruneMiddleware`,
``ESTAFETA_PRUNE_INTERVAL``, ``0`` to turn it off). Several pruners at once are safe.

What it never does: let a duplicate through within the inbox retention (a message's
record goes only once it is older than that, and not while its dead letter is kept), or
let a stale lock holder in (a holder whose fence row went is refused at its check).

One table that cannot be pruned (missing, locked past ``Retention.lock_timeout``, a row
that refuses to go, a service's database that is down) stops only itself: it is reported
with its reason (:attr:`PruneReport.failures`, a warning, ``estafeta_prune_failures_total``)
and every other table and service is pruned.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import attrs
import psycopg
from prometheus_client import Counter

from estafeta.app.middleware import WorkerThread
from estafeta.app.runtime import Runtime
from estafeta.app.settings import Settings
from estafeta_sql import retention as store
from estafeta_sql import saga_writes
from estafeta_sql.errors import DatabaseError, EstafetaError

if TYPE_CHECKING:
    from estafeta.app.service import Service
    from estafeta.sagas.saga import Saga

logger = logging.getLogger(__name__)

FAILURES = Counter("estafeta_prune_failures", "Tables a prune could not prune", ["service", "table"])


@attrs.frozen
class Retention:
    """How long each kind of row is kept."""

    #: Processed message ids (and delivery counts): a copy arriving later runs again.
    inbox: timedelta
    #: Dead letters (never shorter than ``inbox``: their records are kept with them).
    dead_letters: timedelta
    #: Fence rows of lock keys nobody took since.
    fences: timedelta
    #: Logs of completed and compensated sagas.
    saga_log: timedelta
    #: Rows per delete statement.
    batch_size: int = 1000
    #: Seconds a statement waits for a table lock (a migration, ``LOCK TABLE``) before that table is reported.
    lock_timeout: float = 5.0

    @classmethod
    def from_settings(cls, settings: Settings) -> Retention:
        """The retention the ``ESTAFETA_*_RETENTION`` settings ask for."""
        return cls(
            inbox=settings.inbox_retention,
            dead_letters=settings.dead_letter_retention,
            fences=settings.fence_retention,
            saga_log=settings.saga_log_retention,
            batch_size=settings.prune_batch_size,
        )

    def of(self, table: str) -> timedelta:
        """The retention of one of the messaging tables (``estafeta_sql.retention.TABLES``)."""
        return {"inbox": self.inbox, "inbox_attempts": self.inbox, "dead_letters": self.dead_letters}.get(
            table, self.fences
        )


@attrs.frozen
class PruneReport:
    """What a prune did, and what it could not do."""

    #: Rows deleted (with ``dry_run``: that would be), by service and table.
    counts: dict[str, dict[str, int]] = attrs.field(factory=dict)
    #: Tables that could not be pruned, by service and table: the reason, one line.
    failures: dict[str, dict[str, str]] = attrs.field(factory=dict)

    def failed(self, service: str, table: str, exc: BaseException) -> None:
        """Record that ``service.table`` was not pruned because of ``exc`` (logged, counted)."""
        lines = str(exc).strip().splitlines()
        reason = f"{type(exc).__name__}: {lines[0] if lines else ''}"
        self.failures.setdefault(service, {})[table] = reason
        FAILURES.labels(service, table).inc()
        logger.warning("pruning %s.%s failed, the other tables go on: %s", service, table, reason)


def prune(
    runtime: Runtime,
    services: Sequence[Service],
    sagas_: Sequence[Saga],
    *,
    retention: Retention | None = None,
    dry_run: bool = False,
) -> PruneReport:
    """Prune the messaging tables of ``services`` and the logs of ``sagas_``: the rows, by service and table.

    ``retention`` defaults to the runtime's settings; with ``dry_run`` nothing is deleted
    and the counts are what would be. A table that cannot be pruned is reported in the
    result's ``failures`` (and logged) and the others are pruned all the same.
    """
    retention = retention or Retention.from_settings(runtime.settings)
    report = PruneReport()
    for service in services:
        tables = {
            table: functools.partial(
                store.prune,
                schema=service.name,
                table=table,
                older_than=retention.of(table),
                batch_size=retention.batch_size,
                dry_run=dry_run,
            )
            for table in store.TABLES
        }
        _prune_tables(runtime, service.name, tables, retention.lock_timeout, report)
    for saga in sagas_:
        log = functools.partial(
            saga_writes.prune_log,
            table=saga.table,
            older_than=retention.saga_log,
            batch_size=retention.batch_size,
            dry_run=dry_run,
        )
        _prune_tables(runtime, saga.service, {saga.table.log: log}, retention.lock_timeout, report)
    return report


def _prune_tables(
    runtime: Runtime, service: str, tables: Mapping[str, Callable[..., int]], lock_timeout: float, report: PruneReport
) -> None:
    """Run each table's prune on one connection of ``service``'s database; record each failure and go on."""
    try:
        with runtime.database(service).connection() as conn:
            conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{int(lock_timeout * 1000)}ms",))
            try:
                for table, prune_table in tables.items():
                    try:
                        report.counts.setdefault(service, {})[table] = prune_table(conn)
                    except psycopg.Error as exc:
                        report.failed(service, table, exc)
            finally:
                _reset_lock_timeout(conn)
    except EstafetaError as exc:  # no connection to that database (or it broke): its tables only
        for table in tables:
            if table not in report.counts.get(service, {}) and table not in report.failures.get(service, {}):
                report.failed(service, table, exc)


def _reset_lock_timeout(conn: psycopg.Connection[Any]) -> None:
    """Give the pooled connection back as it was (a broken one is discarded by the pool anyway)."""
    with contextlib.suppress(psycopg.Error):
        conn.execute("RESET lock_timeout")


class PruneMiddleware(WorkerThread):
    """Prunes every ``ESTAFETA_PRUNE_INTERVAL`` in each worker process, from boot to shutdown.

    The first run comes at a random point of the first interval, so that workers started
    together do not prune together (they could: it is safe, only wasteful).
    """

    thread_name = "estafeta-pruner"

    def __init__(self, runtime: Runtime, services: Sequence[Service], sagas_: Sequence[Saga]) -> None:
        super().__init__()
        self.runtime = runtime
        self.services = list(services)
        self.sagas = list(sagas_)

    def adopt(self, services: Sequence[Service], sagas_: Sequence[Saga]) -> None:
        """Prune these too (another app bound to the same broker)."""
        self.services.extend(s for s in services if s not in self.services)
        self.sagas.extend(s for s in sagas_ if s not in self.sagas)

    def run(self, stop: threading.Event) -> None:
        interval = self.runtime.settings.prune_interval.total_seconds()
        wait = random.uniform(0, interval)
        while not stop.wait(wait):
            wait = interval
            try:
                done = prune(self.runtime, self.services, self.sagas).counts  # each failure is logged by prune
            except DatabaseError as exc:
                logger.warning("pruning skipped: %s", exc)
                continue
            except Exception:  # never let the thread die: next interval, again
                logger.exception("pruning failed")
                continue
            total = sum(n for tables in done.values() for n in tables.values())
            if total:
                logger.info("pruned %d row(s): %s", total, _summary(done))


def _summary(done: dict[str, dict[str, int]]) -> str:
    return ", ".join(f"{service}.{table} {n}" for service, tables in done.items() for table, n in tables.items() if n)
