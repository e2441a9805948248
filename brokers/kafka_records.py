"""What the Kafka broker, its consumer and the relay's Kafka publisher share: a record's headers, the errors,
and what the consumer and the publisher need of the broker (:class:`ClusterBroker`, :class:`ProducingBroker`).

Kept apart from :mod:`estafeta_brokers.kafka` so that :mod:`estafeta_brokers.kafka_consumer` and
:mod:`estafeta_brokers.kafka_publish`, which the broker builds, never import the broker's module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import dramatiq.errors
from confluent_kafka import KafkaError

if TYPE_CHECKING:
    from .kafka_config import KafkaConfig

#: Delivery errors that are the producer's state, never the record's: the producer is
#: replaced and the rows stay pending without an attempt counted (a broker that lost the
#: producer's sequences after a restart reports them; purges come from dropping it).
PRODUCER_FAILURES = {
    KafkaError._FATAL,
    KafkaError._PURGE_QUEUE,
    KafkaError._PURGE_INFLIGHT,
    KafkaError._DESTROY,
    KafkaError._INCONSISTENT,
    KafkaError._GAPLESS_GUARANTEE,
    KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
    KafkaError.UNKNOWN_PRODUCER_ID,
    KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.INVALID_PRODUCER_ID_MAPPING,
    # After a silent network cut (tests/faults), Tansu answers the old producer with this.
    KafkaError.PRODUCER_FENCED,
}

#: Kafka record headers, as confluent-kafka takes and returns them.
Headers = list[tuple[str, str | bytes | None]]


class KafkaUnreachable(dramatiq.errors.ConnectionClosed):
    """Kafka could not be reached, or did not acknowledge a record in time: try again later.

    A ``ConnectionClosed``, so Dramatiq's consumer threads restart and its ``ack``/``nack``
    handling retries, as with the other brokers.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)  # type: ignore[no-untyped-call]


class KafkaRefused(dramatiq.errors.BrokerError):
    """Kafka refused a record or a topic: trying again will not help until the cause is fixed."""

    def __init__(self, message: str) -> None:
        super().__init__(message)  # type: ignore[no-untyped-call]


def message_headers(message_id: str, options: dict[str, Any], saga_id: object = None) -> Headers:
    """The Kafka headers of a message: its id, and its saga id and trace context when it has them.

    The same values are inside the Dramatiq message; as headers, Kafka tooling (and
    consumers that do not decode Dramatiq's encoding) can route and trace on them.
    """
    headers: Headers = [("message_id", message_id.encode())]
    saga = saga_id if saga_id is not None else options.get("saga_id")
    if saga is not None:
        headers.append(("saga_id", str(saga).encode()))
    for name in ("traceparent", "tracestate"):  # W3C trace context, as the options carry it
        if options.get(name):
            headers.append((name, str(options[name]).encode()))
    return headers


class ClusterBroker(Protocol):
    """A broker on one Kafka cluster, as the relay's Kafka publisher takes it (``kafka.KafkaBroker``)."""

    @property
    def config(self) -> KafkaConfig:
        """The cluster, its topic names and the clients' settings."""


class ProducingBroker(ClusterBroker, Protocol):
    """What a worker's Kafka consumer needs of its broker: producing records, each until Kafka acknowledged it."""

    def produce(self, topic: str, value: bytes, *, key: bytes | None = None, headers: Headers | None = None) -> None:
        """Produce one record and wait for its delivery report; thread-safe."""

    def dead_letter(self, queue_name: str, value: bytes, key: bytes | None, headers: Headers, reason: str) -> None:
        """Produce a record to ``queue_name``'s dead-letter topic with ``reason``; wait for Kafka's ack."""
