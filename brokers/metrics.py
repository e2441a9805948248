"""Prometheus metrics of the relay (``estafeta relay --metrics-port``).

Counters and the latency histogram are updated per batch. The outbox gauges
(pending, failed, oldest pending age) are read from PostgreSQL when Prometheus scrapes,
so they show what is in the tables, whichever relay (or none) is draining them; the
worker processes serve them too. Every name is ``estafeta_outbox_*``: the seed's names
(``outbox_pending_count``, ``outbox_publish_latency_seconds``, ``outbox_failed_count``)
in estafeta's namespace. ``estafeta_clock_moved`` says, per service, that a test's clock is
moved in its schema (:class:`ClockCollector`), served by the same processes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from estafeta_sql import clock, outbox_admin

if TYPE_CHECKING:
    from .outboxes import Outbox

logger = logging.getLogger(__name__)

#: Rows the broker confirmed (and the relay deleted), per service.
PUBLISHED = Counter("estafeta_outbox_published", "Outbox rows published and confirmed by the broker", ["service"])
#: Publish attempts the broker refused (each counts against the row's attempts), per service.
PUBLISH_FAILED = Counter(
    "estafeta_outbox_publish_failed", "Outbox rows the broker refused (one per attempt)", ["service"]
)
#: Batches that found the broker unreachable (their rows stayed pending), per service.
BROKER_UNAVAILABLE = Counter(
    "estafeta_outbox_broker_unavailable", "Batches left pending because the broker was unreachable", ["service"]
)
#: From the row's creation (its transaction's start) to the broker's confirm.
PUBLISH_LATENCY = Histogram(
    "estafeta_outbox_publish_latency_seconds",
    "Seconds from an outbox row's creation (transaction start) to the broker's confirm",
    ["service"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900),
)


class OutboxCollector(Collector):
    """Pending, failed and oldest-pending-age gauges per service, read at scrape time."""

    def __init__(self, outboxes: Sequence[Outbox] = ()) -> None:
        self.outboxes = list(outboxes)

    def describe(self) -> Iterator[Any]:
        # Declared without querying: the registry would otherwise call collect() to learn the names.
        yield from self._families()

    def collect(self) -> Iterator[Any]:
        pending, failed, oldest = self._families()
        for outbox in self.outboxes:
            try:
                with outbox.database.connection() as conn:
                    stats = outbox_admin.stats(conn, outbox.schema)
            except Exception as exc:  # a scrape must not fail because one database is down
                logger.warning("metrics: no outbox stats for %s: %s", outbox.schema, exc)
                continue
            pending.add_metric([outbox.schema], stats.pending)
            failed.add_metric([outbox.schema], stats.failed)
            oldest.add_metric([outbox.schema], stats.oldest_pending_age_seconds)
        yield from (pending, failed, oldest)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        pending = GaugeMetricFamily(
            "estafeta_outbox_pending_count", "Outbox rows not yet published", labels=["service"]
        )
        failed = GaugeMetricFamily(
            "estafeta_outbox_failed_count",
            "Outbox rows that exhausted their attempts (estafeta outbox retry)",
            labels=["service"],
        )
        oldest = GaugeMetricFamily(
            "estafeta_outbox_oldest_pending_age_seconds",
            "How long the longest-waiting row that should be published by now has waited",
            labels=["service"],
        )
        return pending, failed, oldest


class ClockCollector(Collector):
    """Whether each service's clock is moved (its clock table holds a row), read at scrape time.

    Production never moves a clock: a 1 means every time-based decision of that schema
    (deadlines, delays, backoffs, expiries, retention) reads a test's time.
    """

    def __init__(self, outboxes: Sequence[Outbox] = ()) -> None:
        self.outboxes = list(outboxes)

    def describe(self) -> Iterator[Any]:
        yield self._family()

    def collect(self) -> Iterator[Any]:
        moved = self._family()
        for outbox in self.outboxes:
            try:
                with outbox.database.connection() as conn:
                    found = clock.moved(conn, outbox.schema)
            except Exception as exc:  # a scrape must not fail because one database is down
                logger.warning("metrics: no clock state for %s: %s", outbox.schema, exc)
                continue
            moved.add_metric([outbox.schema], 0 if found is None else 1)
        yield moved

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "estafeta_clock_moved",
            "1 when a test's clock is moved in the service's schema (its clock table holds a row): "
            "its decisions read that time, not PostgreSQL's",
            labels=["service"],
        )


#: The collectors of this process (registered once; ``serve`` points them at the outboxes).
COLLECTOR = OutboxCollector()
REGISTRY.register(COLLECTOR)
CLOCK_COLLECTOR = ClockCollector()
REGISTRY.register(CLOCK_COLLECTOR)


def serve(port: int, outboxes: Sequence[Outbox], addr: str = "0.0.0.0") -> Any:
    """Serve ``/metrics`` on ``addr:port`` in a daemon thread; return the HTTP server."""
    COLLECTOR.outboxes = list(outboxes)
    CLOCK_COLLECTOR.outboxes = list(outboxes)
    server, _thread = start_http_server(port, addr=addr)
    return server
