"""Publishing to Kafka a batch at a time: an idempotent producer, delivery reports as the confirms.

The whole batch is produced (librdkafka batches and pipelines the records), then the
relay waits once for every delivery report. A row is confirmed only by a successful
report, which with ``acks=all`` means every in-sync replica has the record. Each record
is what the workers consume: the value is Dramatiq's own encoding of the message (the
outbox row's message id as its id), the key is the row's ``ordering_key`` (so a key's
rows share a partition, and Kafka keeps their order there), the topic is the queue's
(:mod:`estafeta_brokers.kafka_config`), and the message id, saga id and ``traceparent`` are
Kafka headers too. The idempotent producer keeps a partition's records in order and
free of duplicates across its own retries.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from estafeta_sql.outbox import OutboxRow

from .batches import PublishOutcome, after_refusals, describe, encode
from .kafka_config import ClientErrors, ClientLog, KafkaConfig
from .kafka_records import PRODUCER_FAILURES, ClusterBroker, message_headers
from .kafka_topics import KafkaUnavailable, TopicDeclarer, error_text, is_unreachable

logger = logging.getLogger(__name__)

#: The name the relay's producer carries on the broker.
CLIENT_ID = "estafeta-relay"
#: Longest wait for the cluster's answer to the probe before a batch, after an outage or at
#: start (within the attempt's bound): a cluster that cannot be reached is reported this soon.
PROBE_TIMEOUT = 5.0


class _Batch:
    """The rows of one publish and what Kafka reported for each."""

    def __init__(self) -> None:
        self.produced: list[OutboxRow] = []
        self.delivered: set[int] = set()
        self.failed: dict[int, str] = {}
        self.outage: str | None = None
        self.unknown_topics: set[str] = set()
        self.fatal = False
        self.reported = 0

    def report(self, row: OutboxRow, topic: str, error: KafkaError | None) -> None:
        self.reported += 1
        if error is None:
            self.delivered.add(row.id)
        elif error.fatal() or error.code() in PRODUCER_FAILURES:
            self.fatal = True
            self.outage = self.outage or f"the Kafka producer failed: {error.str()}"
        elif error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            # Deleted behind our back: not the row's fault; the topic is created again.
            self.unknown_topics.add(row.queue_name)
        elif is_unreachable(error):  # no ack in time, too few in-sync replicas, no leader...
            self.outage = self.outage or f"Kafka did not acknowledge records for {topic!r}: {error.str()}"
        else:
            self.failed[row.id] = f"Kafka refused the record for topic {topic!r}: {error.str()}"


class KafkaPublisher:
    """Publishes a batch with an idempotent producer and waits once for all delivery reports.

    A record Kafka refuses (too large, a topic it will not create, an authorization or
    policy refusal) counts a failed attempt for its row, and the later rows of that key
    in the batch are not produced. An unreachable cluster, or no answer within
    ``confirm_timeout``, leaves every unconfirmed row pending without an attempt counted.
    ``confirm_timeout`` bounds the whole attempt (the probe, the topics' metadata and
    creation, the delivery reports), so a cluster that accepts connections and never
    answers is reported within it, whichever step it stops answering at.
    """

    def __init__(self, config: KafkaConfig, *, confirm_timeout: float = 15.0) -> None:
        self.config = config
        self.confirm_timeout = confirm_timeout
        self.topics = TopicDeclarer(config, timeout=min(confirm_timeout, 10.0))
        self._producer: Producer | None = None
        self._errors = ClientErrors(logger)
        #: Set after an outage: the next batch first checks that Kafka answers, instead
        #: of queueing a batch in librdkafka that would only time out.
        self._suspect = True

    @classmethod
    def for_broker(cls, broker: ClusterBroker, *, confirm_timeout: float = 15.0, **_: Any) -> KafkaPublisher:
        """A publisher to the cluster and topics of ``broker``."""
        return cls(broker.config, confirm_timeout=confirm_timeout)

    def publish(self, rows: Sequence[OutboxRow]) -> PublishOutcome:
        """Produce ``rows`` in order; report which Kafka acknowledged."""
        if not rows:
            return PublishOutcome()
        # One bound for the whole attempt: each step waits only for what is left of it.
        until = time.monotonic() + self.confirm_timeout
        try:
            self._check_reachable(until)
            refused = self.topics.declare({row.queue_name for row in rows}, timeout=self._left(until, "topics"))
        except KafkaUnavailable as exc:
            self._outage()
            return PublishOutcome(broker_error=self._bounded(str(exc), until))
        failed = {row.id: refused[row.queue_name] for row in rows if row.queue_name in refused}
        batch = _Batch()
        try:
            self._produce(after_refusals(rows, failed), batch)
            self._wait(batch, until)
        except (KafkaException, SystemError) as exc:
            # A producer that failed for good (a broker that lost its sequences, say after a
            # restart without its data) raises out of poll/flush; once, confluent-kafka 2.16
            # raised a SystemError there instead. Either way: replace it, rows stay pending.
            batch.fatal = True
            batch.outage = f"the Kafka producer failed: {describe(exc)}"
            self._drop_producer()
        for queue_name in batch.unknown_topics:
            self.topics.forget(queue_name)
        if batch.outage:
            self._outage()
        confirmed = [row.id for row in batch.produced if row.id in batch.delivered]
        return PublishOutcome(confirmed=confirmed, failed={**failed, **batch.failed}, broker_error=batch.outage)

    def _produce(self, rows: Sequence[OutboxRow], batch: _Batch) -> None:
        producer = self._client()
        stopped: set[str] = set()
        for row in rows:
            if row.ordering_key is not None and row.ordering_key in stopped:
                continue  # an earlier row of this key was refused: keep the order, publish later
            topic = self.config.topic(row.queue_name)
            try:
                self._produce_one(producer, topic, row, batch)
            except KafkaException as exc:
                error = exc.args[0]
                if error.fatal() or is_unreachable(error):
                    batch.fatal = error.fatal()
                    batch.outage = f"the Kafka producer cannot produce: {error.str()}"
                    return  # the rest of the batch stays pending
                batch.failed[row.id] = f"Kafka refused the record for topic {topic!r}: {error.str()}"
                if row.ordering_key is not None:
                    stopped.add(row.ordering_key)
                continue
            batch.produced.append(row)

    def _produce_one(self, producer: Producer, topic: str, row: OutboxRow, batch: _Batch) -> None:
        key = row.ordering_key.encode() if row.ordering_key is not None else None
        headers = message_headers(str(row.message_id), row.message.get("options", {}), row.saga_id)

        def report(error: KafkaError | None, _record: Any) -> None:
            batch.report(row, topic, error)

        while True:
            try:
                producer.produce(topic, value=encode(row), key=key, headers=headers, on_delivery=report)
                return
            except BufferError:  # librdkafka's queue is full: serve reports until it drains
                producer.poll(0.05)

    def _wait(self, batch: _Batch, until: float) -> None:
        producer = self._client()
        # librdkafka reports every record by message.timeout.ms (= confirm_timeout) at the
        # latest; the attempt's bound, which began before the records were produced, comes first.
        started = time.monotonic()
        while batch.reported < len(batch.produced) and time.monotonic() < until and not self._errors.fatal:
            producer.flush(min(1.0, max(0.0, until - time.monotonic())))
            if (self._errors.all_down_at or 0) >= started:
                # Every broker went away: no need to wait out the confirm timeout (what
                # Kafka already has comes again with the rows, a copy the inboxes absorb).
                batch.outage = f"every Kafka broker at {self.config.bootstrap} is down"
                break
        if self._errors.fatal is not None:
            # A fatal error (a broker that lost the producer's sequence, say after a restart
            # without its data) ends this producer: the rows stay pending, a new one takes over.
            batch.fatal = True
            batch.outage = f"the Kafka producer failed: {self._errors.fatal.str()}"
        if batch.reported < len(batch.produced):
            batch.outage = batch.outage or self._no_answer("delivery reports")
            self._drop_producer()
        elif batch.fatal:
            self._drop_producer()

    def _outage(self) -> None:
        # Probe the cluster before the next batch, and look at its topics again: a cluster
        # rebuilt meanwhile (or a broker that kept nothing) may not have them any more.
        self._suspect = True
        self.topics.forget()

    def _check_reachable(self, until: float) -> None:
        if not self._suspect:
            return
        wait = min(self._left(until, "the cluster's metadata"), PROBE_TIMEOUT)
        try:
            self._client().list_topics(timeout=wait)
        except KafkaException as exc:
            # librdkafka says "transport failure" alike for a refused connection and a
            # broker that never answered: what is known is that nothing came in time.
            why = f"no answer within {wait:g} s ({error_text(exc)})"
            raise KafkaUnavailable(f"cannot reach Kafka at {self.config.bootstrap}: {why}") from None
        self._suspect = False

    def _left(self, until: float, what: str) -> float:
        """Seconds left of the attempt for ``what``; :class:`KafkaUnavailable` when none are."""
        left = until - time.monotonic()
        if left <= 0:
            raise KafkaUnavailable(self._no_answer(what))
        return left

    def _bounded(self, error: str, until: float) -> str:
        """``error``, saying so when the attempt's bound cut it short."""
        if time.monotonic() < until or "no answer within" in error:
            return error
        return f"{error}; no answer within {self.confirm_timeout:g} s"

    def _no_answer(self, what: str) -> str:
        return f"Kafka at {self.config.bootstrap}: no answer within {self.confirm_timeout:g} s (waiting for {what})"

    def _client(self) -> Producer:
        if self._producer is None:
            self._errors = ClientErrors(logger)
            overrides = {
                "message.timeout.ms": int(self.confirm_timeout * 1000),
                "logger": ClientLog(logger),
                "error_cb": self._errors,
            }
            self._producer = Producer(self.config.producer_config(CLIENT_ID, **overrides))
        return self._producer

    def _drop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(KafkaException, SystemError):  # a failed producer may refuse these too
                producer.purge()
                producer.flush(0)

    def close(self) -> None:
        """Wait briefly for records in flight, then drop the producer."""
        if self._producer is not None:
            with contextlib.suppress(KafkaException):
                self._producer.flush(min(self.confirm_timeout, 5.0))
        self._producer = None
