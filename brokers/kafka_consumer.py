"""The worker side of the Kafka broker: a consumer group member that commits only what is done.

Dramatiq calls ``ack`` and ``nack`` from its worker threads; the Kafka consumer is used
by the consumer thread alone. So ``ack`` only hands the message over (a thread-safe
queue; first it produces the message's retry if Kafka did not take it when Dramatiq's
``Retries`` middleware did, which swallows the error), ``nack`` first writes the dead
letter (and waits for Kafka's ack, on the calling thread, as Dramatiq's other brokers do),
and the consumer thread, each time Dramatiq asks it for a message, settles what was
handed over and commits every partition up to its lowest unfinished offset
(:class:`estafeta_brokers.kafka_offsets.PartitionOffsets`).

Flow control: at most ``prefetch`` messages are unfinished at once. While that many are,
the consumer takes nothing more from librdkafka and waits for acknowledgements; if that
lasts (long steps), it pauses its partitions and keeps polling, so it stays in its group
however long the steps take. (Pausing at every full moment would cost a second per
resume: librdkafka fetches a resumed partition again only on its next broker-thread wake-up.)

Rebalances: partitions being revoked get ``rebalance_grace`` seconds for the messages
already handed to Dramatiq to finish; then what is done is committed and the rest is
abandoned: their later acks are ignored, and the partition's new owner delivers them
again from the committed offset. Messages fetched but not yet handed over are dropped
at once. A lost partition (the session expired) commits nothing.

A record that kills its worker (SIGKILL, OOM) comes back first after the restart: offsets
never move past it. The inbox counts its deliveries and parks it (``ESTAFETA_MAX_DELIVERIES``);
in a partition's fixed order the same neighbours run beside it every time, and a delivery
after one that died runs alone in its process (``estafeta.steps.delivery._beside_or_alone``), so they are not
parked with it.
"""

from __future__ import annotations

import logging
import queue
import time
from collections import Counter, deque
from typing import Any

import dramatiq
import dramatiq.errors
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from .batches import describe
from .kafka_config import ClientLog
from .kafka_offsets import PartitionOffsets
from .kafka_records import Headers, KafkaRefused, KafkaUnreachable, ProducingBroker
from .kafka_topics import error_text

logger = logging.getLogger(__name__)

#: Longest wait inside one poll, so handed-over acks are committed promptly.
POLL_SLICE = 0.05
#: Seconds at the prefetch limit before the partitions are paused (and polled again).
PAUSE_AFTER = 2.0
#: Commits are batched: at most one per partition set this often.
COMMIT_INTERVAL = 0.1
#: Commit errors that mean "a rebalance is under way": the revoke callback commits instead.
REBALANCING = {
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError._NO_OFFSET,
    KafkaError._STATE,
}


class KafkaMessage(dramatiq.MessageProxy):
    """A message and where it came from: its partition, offset and the assignment it belongs to."""

    def __init__(self, message: dramatiq.Message[Any], record: Message, offsets: PartitionOffsets, offset: int) -> None:
        super().__init__(message)
        self.kafka_partition = offsets.partition
        self.kafka_offset = offset
        self.kafka_key = record.key()
        self.kafka_headers = headers_of(record)
        #: A record Kafka did not take while this message was processed (its retry): topic, value, headers.
        self.unsent: tuple[str, bytes, Headers] | None = None
        self._offsets = offsets


def headers_of(record: Message) -> Headers:
    """``record``'s headers, as a list."""
    headers = record.headers() or []
    return list(headers.items()) if isinstance(headers, dict) else list(headers)


class KafkaConsumer(dramatiq.Consumer):
    """Consumes one queue's topic as a member of the queue's consumer group."""

    def __init__(self, broker: ProducingBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        self.broker = broker
        self.queue_name = queue_name
        self.prefetch = max(1, prefetch)
        self.timeout = timeout / 1000
        self.topic = broker.config.topic(queue_name)
        # Delayed messages wait in Dramatiq's memory until their eta: waiting for them in
        # a rebalance would only stall the group, so a delay queue abandons them at once.
        self.grace = 0.0 if queue_name.endswith(".DQ") else broker.config.rebalance_grace
        self.partitions: dict[int, PartitionOffsets] = {}
        self.buffer: deque[KafkaMessage] = deque()
        self.handed_over: queue.SimpleQueue[KafkaMessage] = queue.SimpleQueue()
        self.paused = False
        #: When the prefetch limit was reached (``None``: below it).
        self.full_since: float | None = None
        self.closing = False
        self.last_commit = 0.0
        config = broker.config.consumer_config(queue_name, "estafeta-worker")
        try:
            self.consumer = Consumer({**config, "logger": ClientLog(logger)})
            self.consumer.subscribe(
                [self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
            )
        except KafkaException as exc:
            raise KafkaUnreachable(f"cannot consume {self.topic!r}: {error_text(exc)}") from None

    # -- what Dramatiq calls ----------------------------------------------------

    def ack(self, message: dramatiq.MessageProxy) -> None:
        """Mark ``message`` finished (from any thread); its offset is committed by the consumer thread.

        A retry Kafka did not take while the message was processed is produced first: raises
        :class:`KafkaUnreachable` while Kafka cannot take it (Dramatiq then tries the ack again,
        and the offset does not move past the message meanwhile).
        """
        if not isinstance(message, KafkaMessage):
            return
        if message.unsent is not None:
            topic, value, headers = message.unsent
            try:
                self.broker.produce(topic, value, headers=headers)
            except KafkaRefused as exc:
                logger.error("the retry of message %s is lost: %s", message.message_id, exc)
            message.unsent = None
        self.handed_over.put(message)

    def nack(self, message: dramatiq.MessageProxy) -> None:
        """Write ``message`` to the dead-letter topic, with the reason, then mark it finished.

        Raises :class:`KafkaUnreachable` while Kafka cannot take the dead letter: Dramatiq then
        tries again, and the offset does not move past the message meanwhile.
        """
        if not isinstance(message, KafkaMessage):
            return
        exception = getattr(message, "_exception", None)
        reason = describe(exception) if exception is not None else "rejected"
        body = dramatiq.Message(**message.asdict()).encode()
        where = (message.kafka_partition, message.kafka_offset)
        self._dead_letter(body, message.kafka_key, message.kafka_headers, reason, where)
        self.handed_over.put(message)

    def requeue(self, messages: Any) -> None:
        """Nothing to do: unfinished messages are not committed, the group delivers them again."""

    def __next__(self) -> dramatiq.MessageProxy | None:
        """The next message, or ``None`` after ``timeout`` without one; commits what is done meanwhile."""
        deadline = time.monotonic() + self.timeout
        while True:
            self._settle()
            self._commit(force=False)
            if self.buffer:
                return self.buffer.popleft()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if self._full():
                self._wait_while_full(min(remaining, POLL_SLICE))
                continue
            try:
                records = self._fetch(min(remaining, POLL_SLICE))
            except KafkaException as exc:
                raise KafkaUnreachable(error_text(exc)) from None
            for record in records:
                self._receive(record)

    def close(self) -> None:
        """Commit what is done and leave the group (its partitions move on at once)."""
        self.closing = True
        try:
            self._settle()
            self._commit(force=True)
            self.consumer.close()
        except (KafkaException, RuntimeError) as exc:
            logger.warning("closing the consumer of %s: %s", self.topic, exc)

    # -- receiving --------------------------------------------------------------

    def _fetch(self, wait: float) -> list[Message]:
        """What librdkafka has fetched, up to the prefetch; else wait up to ``wait`` for one record.

        ``consume(n, timeout)`` waits for ``n`` records or the whole timeout, which would
        add the timeout to every message's latency; ``poll`` returns with the first one.
        """
        records = self.consumer.consume(num_messages=max(1, self.prefetch - self._unfinished()), timeout=0)
        if records:
            return records
        record = self.consumer.poll(wait)
        return [record] if record is not None else []

    def _receive(self, record: Message) -> None:
        error = record.error()
        if error is not None:
            if error.fatal():
                raise KafkaUnreachable(f"{self.topic}: {error.str()}")
            if error.code() != KafkaError._PARTITION_EOF:
                logger.warning("consumer of %s: %s", self.topic, error.str())
            return
        partition, offset = record.partition(), record.offset()
        offsets = self.partitions.get(partition) if partition is not None else None
        if offsets is None or offset is None:
            return  # fetched just before its partition was revoked: its new owner has it
        offsets.received(offset)
        try:
            message = dramatiq.Message.decode(record.value() or b"")
        except dramatiq.errors.DecodeError as exc:
            self._dead_letter_undecodable(record, offsets, offset, exc)
            return
        self.buffer.append(KafkaMessage(message, record, offsets, offset))

    def _dead_letter_undecodable(self, record: Message, offsets: PartitionOffsets, offset: int, exc: Exception) -> None:
        reason = f"undecodable message: {describe(exc)}"
        logger.error("%s at %s[%d]@%d; dead-lettered", reason, self.topic, offsets.partition, offset)
        self._dead_letter(record.value() or b"", record.key(), headers_of(record), reason, (offsets.partition, offset))
        offsets.finished(offset)

    def _dead_letter(
        self, value: bytes, key: bytes | None, headers: Headers, reason: str, where: tuple[int, int]
    ) -> None:
        """Write the dead letter; an outage propagates (tried again later), a refusal is logged.

        A dead-letter topic that refuses the record for good (a policy, an authorization)
        must not stop the partition for ever: the record is left where it is, in the
        queue's own topic until retention removes it, and the log says where.
        """
        try:
            self.broker.dead_letter(self.queue_name, value, key, headers, reason)
        except KafkaRefused as exc:
            partition, offset = where
            logger.error(
                "cannot dead-letter %s[%d]@%d (%s): %s; the record stays in that topic until its retention ends",
                self.topic,
                partition,
                offset,
                reason,
                exc,
            )

    def _unfinished(self) -> int:
        return sum(p.in_flight for p in self.partitions.values())

    def _full(self) -> bool:
        """Whether ``prefetch`` messages are unfinished; resumes paused partitions when not."""
        if self._unfinished() < self.prefetch:
            self.full_since = None
            if self.paused:
                self.consumer.resume(self.consumer.assignment())
                self.paused = False
            return False
        if self.full_since is None:
            self.full_since = time.monotonic()
        return True

    def _wait_while_full(self, wait: float) -> None:
        """Wait for an acknowledgement; after ``PAUSE_AFTER`` seconds, pause and poll instead.

        Polling a paused consumer returns no records but serves rebalances and counts as
        the application being alive (``max.poll.interval.ms``).
        """
        full_for = time.monotonic() - (self.full_since or time.monotonic())
        if not self.paused and full_for >= PAUSE_AFTER:
            self.consumer.pause(self.consumer.assignment())
            self.paused = True
        if self.paused:
            record = self.consumer.poll(wait)
            if record is not None:
                self._receive(record)  # from a partition assigned since the pause
            return
        try:
            message = self.handed_over.get(timeout=wait)
        except queue.Empty:
            return
        self.handed_over.put(message)  # settled with the others, in order

    # -- settling and committing --------------------------------------------------

    def _settle(self) -> None:
        while True:
            try:
                message = self.handed_over.get_nowait()
            except queue.Empty:
                return
            # Only under the assignment it came from: after a revoke, the new owner decides.
            if self.partitions.get(message.kafka_partition) is message._offsets:
                message._offsets.finished(message.kafka_offset)

    def _commit(self, *, force: bool, partitions: list[int] | None = None) -> None:
        now = time.monotonic()
        if not force and now - self.last_commit < COMMIT_INTERVAL:
            return
        self.last_commit = now
        chosen = [self.partitions[p] for p in (partitions if partitions is not None else self.partitions)]
        due = [(p, point) for p in chosen if (point := p.due()) is not None]
        if not due:
            return
        try:
            self.consumer.commit(
                offsets=[TopicPartition(self.topic, p.partition, point) for p, point in due], asynchronous=False
            )
        except KafkaException as exc:
            error = exc.args[0]
            level = logging.DEBUG if error.code() in REBALANCING else logging.WARNING
            logger.log(level, "commit on %s failed (it is retried): %s", self.topic, error.str())
            return
        for p, point in due:
            p.committed = point

    # -- rebalances ----------------------------------------------------------------

    def _on_assign(self, _consumer: Consumer, assigned: list[TopicPartition]) -> None:
        for tp in assigned:
            self.partitions[tp.partition] = PartitionOffsets(tp.partition)
        self.paused = False  # new partitions start fetching; flow control pauses them again if need be
        logger.info("%s: assigned partitions %s", self.topic, sorted(tp.partition for tp in assigned))

    def _on_revoke(self, _consumer: Consumer, revoked: list[TopicPartition]) -> None:
        numbers = {tp.partition for tp in revoked}
        # Fetched but never handed to Dramatiq: dropped, and still unfinished, so the
        # commit stops below them and the partition's next owner delivers them.
        dropped = Counter(m.kafka_partition for m in self.buffer if m.kafka_partition in numbers)
        self.buffer = deque(m for m in self.buffer if m.kafka_partition not in numbers)
        owned = {p: self.partitions[p] for p in numbers if p in self.partitions}
        self._wait_for_handed_over(owned, dropped)
        self._commit(force=True, partitions=list(owned))
        for p in owned:
            del self.partitions[p]
        logger.info("%s: revoked partitions %s", self.topic, sorted(numbers))

    def _wait_for_handed_over(self, owned: dict[int, PartitionOffsets], dropped: Counter[int]) -> None:
        """Give the messages Dramatiq is working on up to the grace period to finish."""
        grace = 0 if self.closing else self.grace
        unfinished = sum(offsets.in_flight - dropped[p] for p, offsets in owned.items())
        if unfinished and grace:
            logger.info(
                "%s: waiting up to %gs for %d unfinished message(s) of revoked partitions %s",
                self.topic,
                grace,
                unfinished,
                sorted(owned),
            )
        deadline = time.monotonic() + grace
        while True:
            self._settle()
            if all(offsets.in_flight <= dropped[p] for p, offsets in owned.items()):
                return
            if time.monotonic() >= deadline:
                logger.info("%s: abandoning unfinished messages of partitions %s", self.topic, sorted(owned))
                return
            time.sleep(0.01)

    def _on_lost(self, _consumer: Consumer, lost: list[TopicPartition]) -> None:
        numbers = {tp.partition for tp in lost}
        self.buffer = deque(m for m in self.buffer if m.kafka_partition not in numbers)
        for p in numbers:
            self.partitions.pop(p, None)
        logger.warning(
            "%s: lost partitions %s (session expired); their unfinished messages come again",
            self.topic,
            sorted(numbers),
        )
