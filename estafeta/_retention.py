"""Retention: what the messaging tables and saga logs keep, and pruning the rest.

The inbox, the delivery counts, the dead letters, the fence rows and the logs of ended
sagas would grow forever. :func:`prune` deletes what is older than its retention, a
batch at a time in short transactions, skipping rows someone holds; ``estafeta prune``
runs it once, and every worker process runs it periodically (:class:`PruneMiddleware`,
``ESTAFETA_PRUNE_INTERVAL``, ``0`` to turn it off). Several pruners at once are safe.

What it never does: let a duplicate through within the inbox retention (a message's
record goes only once it is older than that, and not while its dead letter is kept), or
let a stale lock holder in (a holder whose fence row went is refused at its check).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import attrs
import dramatiq

from sql import retention as store
from sql import sagas
from sql.errors import DatabaseError

from ._runtime import Runtime
from ._settings import Settings

if TYPE_CHECKING:
    from ._app import Service
    from ._saga import Saga

logger = logging.getLogger(__name__)


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
        """The retention of one of the messaging tables (``sql.retention.TABLES``)."""
        return {"inbox": self.inbox, "inbox_attempts": self.inbox, "dead_letters": self.dead_letters}.get(
            table, self.fences
        )


def prune(
    runtime: Runtime,
    services: Sequence[Service],
    sagas_: Sequence[Saga],
    *,
    retention: Retention | None = None,
    dry_run: bool = False,
) -> dict[str, dict[str, int]]:
    """Prune the messaging tables of ``services`` and the logs of ``sagas_``; return the rows, by service and table.

    ``retention`` defaults to the runtime's settings; with ``dry_run`` nothing is deleted
    and the counts are what would be.
    """
    retention = retention or Retention.from_settings(runtime.settings)
    done: dict[str, dict[str, int]] = {}
    for service in services:
        with runtime.database(service.name).connection() as conn:
            done[service.name] = {
                table: store.prune(
                    conn, service.name, table, retention.of(table), batch_size=retention.batch_size, dry_run=dry_run
                )
                for table in store.TABLES
            }
    for saga in sagas_:
        with runtime.database(saga.service).connection() as conn:
            pruned = sagas.prune_log(
                conn, saga.table, retention.saga_log, batch_size=retention.batch_size, dry_run=dry_run
            )
        done.setdefault(saga.service, {})[saga.table.log] = pruned
    return done


class PruneMiddleware(dramatiq.Middleware):
    """Prunes every ``ESTAFETA_PRUNE_INTERVAL`` in each worker process, from boot to shutdown.

    The first run comes at a random point of the first interval, so that workers started
    together do not prune together (they could: it is safe, only wasteful).
    """

    def __init__(self, runtime: Runtime, services: Sequence[Service], sagas_: Sequence[Saga]) -> None:
        self.runtime = runtime
        self.services = list(services)
        self.sagas = list(sagas_)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def adopt(self, services: Sequence[Service], sagas_: Sequence[Saga]) -> None:
        """Prune these too (another app bound to the same broker)."""
        self.services.extend(s for s in services if s not in self.services)
        self.sagas.extend(s for s in sagas_ if s not in self.sagas)

    def after_worker_boot(self, broker: dramatiq.Broker, worker: Any) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="estafeta-pruner", daemon=True)
        self._thread.start()

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        interval = self.runtime.settings.prune_interval.total_seconds()
        wait = random.uniform(0, interval)
        while not self._stop.wait(wait):
            wait = interval
            try:
                done = prune(self.runtime, self.services, self.sagas)
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
