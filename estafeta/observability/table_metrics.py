"""Gauges read from the tables when Prometheus scrapes: sagas by status, stuck sagas, dead letters.

Also the vacuum state of each service's outbox, inbox and ``inbox_attempts`` (dead tuples,
last autovacuum), from PostgreSQL's statistics: one more query per service.

Nothing here is counted in memory: whichever process serves them, however often workers
restarted, they say what the tables hold at the scrape. The outbox gauges are
:class:`estafeta_brokers.metrics.OutboxCollector`'s (the relay serves them too). One scrape runs
one query per service for its dead letters and two per saga kind: counting sagas by status
reads the saga table; the stuck count reads only the live sagas (a partial index) and
their latest log entries.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import attrs
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from estafeta_brokers.outboxes import Outbox
from estafeta_sql import inbox, saga_reports, sagas, table_health
from estafeta_sql.pool import Database
from estafeta_sql.sagas import SagaTable

logger = logging.getLogger(__name__)

#: Every status a saga can be in (each is reported, zero included): ``gave_up`` apart from
#: ``failed``, since a late answer may still move a saga the watchdog gave up on.
STATUSES = sagas.STATUSES


@attrs.frozen
class SagaKind:
    """One kind of saga, as the gauges see it: its name, its tables, their database."""

    name: str
    table: SagaTable
    database: Database


class TablesCollector(Collector):
    """Sagas by status, stuck sagas and the longest wait per saga kind; dead letters and vacuum state per service.

    A kind or service whose database cannot be read loses only its own samples (and logs why).
    """

    def __init__(self, services: Sequence[Outbox], kinds: Sequence[SagaKind], stuck_after: float) -> None:
        self.services = list(services)
        self.kinds = list(kinds)
        self.stuck_after = timedelta(seconds=stuck_after)

    def describe(self) -> Iterator[Any]:
        # Declared without querying: the registry would otherwise call collect() to learn the names.
        yield from self._families()
        yield from self._vacuum_families()

    def collect(self) -> Iterator[Any]:
        by_status, stuck, longest, dead = self._families()
        for kind in self.kinds:
            try:
                with kind.database.connection() as conn:
                    counts = saga_reports.count_by_status(conn, kind.table)
                    stalled, waited = saga_reports.stalls(conn, kind.table, self.stuck_after)
            except Exception as exc:  # a scrape must not fail because one database is down
                logger.warning("metrics: no saga counts for %s: %s", kind.name, exc)
                continue
            for status in STATUSES:
                by_status.add_metric([kind.name, status], counts.get(status, 0))
            stuck.add_metric([kind.name], stalled)
            longest.add_metric([kind.name], waited)
        for service in self.services:
            try:
                with service.database.connection() as conn:
                    dead.add_metric([service.schema], inbox.count_dead_letters(conn, service.schema))
            except Exception as exc:
                logger.warning("metrics: no dead-letter count for %s: %s", service.schema, exc)
        yield from (by_status, stuck, longest, dead)
        yield from self._vacuum()

    def _vacuum(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        dead, vacuumed = self._vacuum_families()
        for service in self.services:
            try:
                with service.database.connection() as conn:
                    stats = table_health.vacuum_stats(conn, service.schema)
            except Exception as exc:  # one service's database down costs only its samples
                logger.warning("metrics: no vacuum statistics for %s: %s", service.schema, exc)
                continue
            for table in stats:
                dead.add_metric([service.schema, table.table], table.dead_tuples)
                vacuumed.add_metric([service.schema, table.table], table.last_autovacuum)
        return dead, vacuumed

    @staticmethod
    def _vacuum_families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "estafeta_table_dead_tuples",
                "Dead row versions in a service's outbox, inbox or inbox_attempts (pg_stat_user_tables)",
                labels=["service", "table"],
            ),
            GaugeMetricFamily(
                "estafeta_table_last_autovacuum_timestamp_seconds",
                "Unix time autovacuum last cleaned the table; 0 if it never did",
                labels=["service", "table"],
            ),
        )

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        minutes = self.stuck_after.total_seconds() / 60
        return (
            GaugeMetricFamily("estafeta_sagas", "Sagas by status, in the saga tables", labels=["saga", "status"]),
            GaugeMetricFamily(
                "estafeta_sagas_stuck",
                f"Live sagas in one state for over {minutes:g} min (re-sends are not progress)",
                labels=["saga"],
            ),
            GaugeMetricFamily(
                "estafeta_saga_longest_wait_seconds",
                "Seconds the live saga that has waited longest has been in its current state",
                labels=["saga"],
            ),
            GaugeMetricFamily("estafeta_dead_letters", "Messages parked in dead_letters", labels=["service"]),
        )
