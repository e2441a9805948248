"""Liveness gauges, read from the heartbeat tables (and the broker's queues) when Prometheus scrapes.

Served by every ``dramatiq`` command's metrics port and by ``estafeta relay
--metrics-port``: while the workers are down the relay reports their queues, and while the
relays are down the workers report the outboxes. The alert rules take the max over the copies.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import dramatiq
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from estafeta.observability.heartbeats import Kind
from estafeta.observability.liveness import Condition, Liveness, ServiceSpec, read_liveness

if TYPE_CHECKING:
    from estafeta.app.settings import Settings
    from estafeta_brokers.outboxes import Outbox

logger = logging.getLogger(__name__)


class LivenessCollector(Collector):
    """Heartbeat age and live processes per service and kind, and the three unserved conditions."""

    def __init__(self, read: Callable[[], Liveness]) -> None:
        self.read = read

    def describe(self) -> Iterator[Any]:
        # Declared without querying: the registry would otherwise call collect() to learn the names.
        yield from _families()

    def collect(self) -> Iterator[Any]:
        age, live, outbox, queue, projection = families = _families()
        try:
            liveness = self.read()
        except Exception as exc:  # a scrape must not fail because a database or the broker is down
            logger.warning("metrics: no liveness: %s", exc)
            yield from families
            return
        for service in liveness.services:
            if service.error and service.outbox_pending is None:
                continue  # its database could not be read: no sample rather than a false zero
            for kind in Kind:
                rows = [row for row in service.heartbeats if row.kind == kind.value]
                live.add_metric([service.service, kind.value], len(service.live(kind)))
                if rows:
                    age.add_metric([service.service, kind.value], min(row.age_seconds for row in rows))
            unserved = {(u.condition, u.subject): u for u in service.unserved}
            relayless = unserved.get((Condition.OUTBOX_WITHOUT_RELAY, service.service))
            outbox.add_metric([service.service], relayless.waiting or 0 if relayless else 0)
            if service.queue_waiting is not None:
                idle = unserved.get((Condition.QUEUE_WITHOUT_CONSUMER, service.service))
                queue.add_metric([service.service], idle.waiting or 0 if idle else 0)
            for name in service.projections:
                orphan = (Condition.PROJECTION_WITHOUT_PROJECTOR, name) in unserved
                projection.add_metric([service.service, name], 1 if orphan else 0)
        yield from families


def _families() -> tuple[GaugeMetricFamily, ...]:
    return (
        GaugeMetricFamily(
            "estafeta_heartbeat_age_seconds",
            "Seconds since the freshest heartbeat of a kind of process in a service (database clock)",
            labels=["service", "kind"],
        ),
        GaugeMetricFamily(
            "estafeta_live_processes",
            "Processes of a kind whose heartbeat is live (within three beats) in a service",
            labels=["service", "kind"],
        ),
        GaugeMetricFamily(
            "estafeta_outbox_pending_without_relay",
            "Pending outbox rows of a service while no live relay serves its outbox (0 otherwise)",
            labels=["service"],
        ),
        GaugeMetricFamily(
            "estafeta_queue_waiting_without_consumer",
            "Messages waiting on a queue while no live worker consumes it (0 otherwise)",
            labels=["queue"],
        ),
        GaugeMetricFamily(
            "estafeta_projection_without_projector",
            "1 for a projection that no live projector serves",
            labels=["service", "projection"],
        ),
    )


def manifest_collector(
    settings: Settings, specs: Sequence[dict[str, Any]], outboxes: Sequence[Outbox]
) -> LivenessCollector:
    """The collector of a ``dramatiq`` command's metrics fork: the services its manifest names, on its own pools.

    The broker (for the queues' backlogs) is built from the settings at the first scrape.
    """
    services = [ServiceSpec(s["name"], s["has_queue"], tuple(s["projections"])) for s in specs]
    databases = {outbox.schema: outbox.database for outbox in outboxes}
    broker = functools.cache(lambda: _broker(settings))
    return LivenessCollector(lambda: read_liveness(services, databases.__getitem__, broker()))


def _broker(settings: Settings) -> dramatiq.Broker | None:
    """A broker to count the queues' messages on: RabbitMQ and Redis only (see ``estafeta_brokers.queue_depth``)."""
    from estafeta_brokers import broker_from_url

    if not settings.broker_url.startswith(("amqp", "redis")):
        return None
    return broker_from_url(settings.broker_url, **settings.broker_options)
