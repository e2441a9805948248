"""A Dramatiq broker on Kafka (confluent-kafka, i.e. librdkafka).

Queue ``Q`` is the topic ``<prefix>Q``; Dramatiq's delay queue ``Q.DQ`` and dead-letter
queue ``Q.XQ`` are topics too (see :mod:`estafeta_brokers.kafka_config`). So everything Dramatiq
does on RabbitMQ and Redis works unchanged:

- ``enqueue`` produces with an idempotent, ``acks=all`` producer and returns only once
  the delivery report came back (like RabbitMQ's publisher confirms);
- ``enqueue(message, delay=...)`` (what the ``Retries`` middleware does) produces to the
  delay topic with an ``eta``; the worker's delay-queue consumer holds it until then and
  enqueues it to the queue's topic. A retry never holds back the partition it came from:
  the failed message is acknowledged as soon as its retry is safely in the delay topic;
- ``nack`` (retries exhausted, unknown actor, undecodable bytes) produces the record to
  the dead-letter topic, with the reason in a ``dead_letter_reason`` header, before the
  offset may move past it;
- every worker consumer of queue ``Q`` is a member of the consumer group ``<group>.<topic>``
  and commits, per partition, only up to the lowest message still in flight
  (:mod:`estafeta_brokers.kafka_consumer`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, NoReturn

import dramatiq
from confluent_kafka import KafkaError, KafkaException, Producer
from dramatiq.common import current_millis, dq_name, xq_name

from .kafka_config import ClientErrors, ClientLog, KafkaConfig
from .kafka_consumer import KafkaConsumer, KafkaMessage
from .kafka_publish import KafkaPublisher
from .kafka_records import PRODUCER_FAILURES

# What the consumer and the publisher share with the broker; its names stay importable from here.
from .kafka_records import Headers as Headers
from .kafka_records import KafkaRefused as KafkaRefused
from .kafka_records import KafkaUnreachable as KafkaUnreachable
from .kafka_records import message_headers as message_headers
from .kafka_topics import KafkaUnavailable, TopicDeclarer, is_unreachable

logger = logging.getLogger(__name__)

#: How long ``enqueue`` waits for Kafka to acknowledge a record (librdkafka retries until then).
DELIVERY_TIMEOUT = 30.0
#: The name workers' producers and consumers carry on the broker.
CLIENT_ID = "estafeta-worker"


class _Delivery:
    """Waits for one record's delivery report (set by whichever thread polls the producer)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: KafkaError | None = None

    def __call__(self, error: KafkaError | None, _message: Any) -> None:
        self.error = error
        self.done.set()


class KafkaBroker(dramatiq.Broker):
    """Dramatiq's broker interface on Kafka; see the module's documentation."""

    def __init__(self, config: KafkaConfig, *, middleware: list[dramatiq.Middleware] | None = None) -> None:
        super().__init__(middleware=middleware)
        self.config = config
        self.queues: set[str] = set()
        #: Creates missing topics (shared by enqueue and consumers).
        self.topics = TopicDeclarer(config)
        self.delivery_timeout = DELIVERY_TIMEOUT
        self._producer: Producer | None = None
        self._errors = ClientErrors(logger)
        self._producer_lock = threading.Lock()

    # -- declaring --------------------------------------------------------------

    def declare_queue(self, queue_name: str) -> None:
        """Declare ``queue_name`` and its delay queue; topics are created on first use, not here.

        Declaring needs no connection (an ``import`` of a worker module must not fail
        while Kafka is down); the topics are made sure of by the first enqueue or consume.
        """
        if queue_name in self.queues:
            return
        self.emit_before("declare_queue", queue_name)
        self.queues.add(queue_name)
        self.emit_after("declare_queue", queue_name)
        delayed = dq_name(queue_name)
        self.delay_queues.add(delayed)
        self.emit_after("declare_delay_queue", delayed)

    def get_declared_queues(self) -> set[str]:
        """The queues declared on this broker."""
        return set(self.queues)

    def ensure_topics(self, queue_name: str) -> None:
        """Make sure ``queue_name``'s topics exist; :class:`KafkaUnreachable` if Kafka cannot be reached."""
        try:
            refused = self.topics.declare([queue_name])
        except KafkaUnavailable as exc:
            raise KafkaUnreachable(str(exc)) from None
        if refused:
            raise KafkaRefused(next(iter(refused.values())))

    # -- producing --------------------------------------------------------------

    def enqueue(self, message: dramatiq.Message[Any], *, delay: int | None = None) -> dramatiq.Message[Any]:
        """Produce ``message`` (to the delay topic with an ``eta`` if ``delay`` ms is given); wait for Kafka's ack.

        Raises :class:`KafkaUnreachable` if Kafka did not acknowledge it within the delivery
        timeout, :class:`KafkaRefused` if Kafka refused it.
        """
        queue_name, delivered = message.queue_name, message
        if delay is not None:
            queue_name = dq_name(queue_name)
            message = message.copy(queue_name=queue_name, options={"eta": current_millis() + delay})
        self.ensure_topics(queue_name)
        self.emit_before("enqueue", message, delay)
        topic, value = self.config.topic(queue_name), message.encode()
        headers = message_headers(message.message_id, message.options)
        try:
            self.produce(topic, value, headers=headers)
        except KafkaUnreachable:
            # Dramatiq's Retries middleware re-enqueues a failed message from a hook that
            # swallows this error, and the message is acknowledged next: its retry would be
            # lost. The consumed message keeps the record, and its acknowledgement produces it.
            if isinstance(delivered, KafkaMessage):
                delivered.unsent = (topic, value, headers)
            raise
        self.emit_after("enqueue", message, delay)
        return message

    def dead_letter(self, queue_name: str, value: bytes, key: bytes | None, headers: Headers, reason: str) -> None:
        """Produce a record to ``queue_name``'s dead-letter topic with ``reason``; wait for Kafka's ack."""
        self.ensure_topics(queue_name)
        headers = [*headers, ("dead_letter_reason", reason.encode(errors="replace"))]
        self.produce(self.config.topic(xq_name(queue_name)), value, key=key, headers=headers)

    def produce(self, topic: str, value: bytes, *, key: bytes | None = None, headers: Headers | None = None) -> None:
        """Produce one record and wait for its delivery report; thread-safe."""
        producer = self.producer()
        delivery = _Delivery()
        while True:
            try:
                producer.produce(topic, value=value, key=key, headers=headers or [], on_delivery=delivery)
                break
            except BufferError:  # the local queue is full: let it drain
                producer.poll(0.1)
            except KafkaException as exc:  # refused before sending (too large...), or the producer is dead
                self._raise_for(exc.args[0], topic)
        deadline = time.monotonic() + self.delivery_timeout + 5
        while not delivery.done.is_set():
            if time.monotonic() > deadline:
                raise KafkaUnreachable(f"no delivery report from Kafka for {topic!r}")
            try:
                producer.poll(0.05)
            except KafkaException as exc:  # the producer failed for good (see _raise_for)
                self._raise_for(exc.args[0], topic)
            if self._errors.fatal is not None:
                self._raise_for(self._errors.fatal, topic)
        if delivery.error is not None:
            self._raise_for(delivery.error, topic)

    def _raise_for(self, error: KafkaError, topic: str) -> NoReturn:
        # The producer's state, not the record's (a fenced or fatally failed producer
        # refuses every later record): a fresh producer gets a new producer id.
        broken = error.fatal() or error.code() in PRODUCER_FAILURES
        if broken:
            self._reset_producer()
        text = f"Kafka did not take a record for {topic!r}: {error.str()}"
        if is_unreachable(error) or broken:
            raise KafkaUnreachable(text)
        raise KafkaRefused(text)

    def producer(self) -> Producer:
        """This broker's idempotent producer (created on first use)."""
        with self._producer_lock:
            if self._producer is None:
                self._errors = ClientErrors(logger)
                overrides = {
                    "message.timeout.ms": int(self.delivery_timeout * 1000),
                    "linger.ms": 1,
                    "logger": ClientLog(logger),
                    "error_cb": self._errors,
                }
                self._producer = Producer(self.config.producer_config(CLIENT_ID, **overrides))
            return self._producer

    def _reset_producer(self) -> None:
        # A fatal error (the idempotent producer's sequence is broken) ends that
        # producer; a fresh one gets a new producer id.
        with self._producer_lock:
            self._producer = None

    def relay_publisher(self, **options: Any) -> Any:
        """The relay's batched publisher for this cluster (see :func:`estafeta_brokers.publish.publisher_for`)."""
        return KafkaPublisher.for_broker(self, **options)

    # -- consuming --------------------------------------------------------------

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> dramatiq.Consumer:
        """A consumer of ``queue_name`` in its group, with at most ``prefetch`` messages unfinished."""
        self.ensure_topics(queue_name)
        return KafkaConsumer(self, queue_name, prefetch, timeout)

    def flush(self, queue_name: str) -> None:
        """Not possible on Kafka: records stay until retention removes them."""
        raise NotImplementedError("Kafka topics cannot be emptied by a client; records expire with retention")

    def flush_all(self) -> None:
        """Not possible on Kafka; see :meth:`flush`."""
        self.flush("")

    def close(self) -> None:
        """Wait for records still being produced, then drop the producer."""
        with self._producer_lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(KafkaException):
                producer.flush(5)
