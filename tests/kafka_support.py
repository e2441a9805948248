"""Reading what reached Kafka in the tests: a topic's records, a consumer group's committed offsets.

Read with plain confluent-kafka clients, outside any consumer group, so reading never
moves a worker's offsets. Tansu's high watermarks lag behind (it reports the last
batch's base offset), so a partition counts as read when the consumer reports its end.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import attrs
import dramatiq
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from estafeta_brokers.kafka_config import parse_kafka_url


@attrs.frozen
class Record:
    """One Kafka record, as read back."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]

    def message(self) -> dramatiq.Message[Any]:
        """The Dramatiq message in its value."""
        return dramatiq.Message.decode(self.value)


def read_topic(url: str, queue_name: str, timeout: float = 20.0) -> list[Record]:
    """Every record of ``queue_name``'s topic (``.DQ``/``.XQ`` names too), partition by partition, in offset order."""
    config = parse_kafka_url(url)
    topic = config.topic(queue_name)
    consumer = Consumer(
        {
            **config.common,
            "bootstrap.servers": config.bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])  # 0: from the first offset
        return _read_to_end(consumer, set(partitions), timeout)
    finally:
        consumer.close()


def _read_to_end(consumer: Consumer, partitions: set[int], timeout: float) -> list[Record]:
    records: list[Record] = []
    ended: set[int] = set()
    deadline = time.monotonic() + timeout
    while ended != partitions:
        if time.monotonic() > deadline:
            raise AssertionError(f"partitions {sorted(partitions - ended)} not read to their end in {timeout:g} s")
        for msg in consumer.consume(500, 0.5):
            error = msg.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise AssertionError(f"reading the topic: {error.str()}")
                ended.add(msg.partition())  # type: ignore[arg-type]
                continue
            headers = {name: value for name, value in (msg.headers() or []) if isinstance(value, bytes)}
            records.append(Record(msg.partition(), msg.offset(), msg.key(), msg.value() or b"", headers))  # type: ignore[arg-type]
    return sorted(records, key=lambda r: (r.partition, r.offset))


def committed_offsets(url: str, queue_name: str) -> dict[int, int]:
    """The offsets ``queue_name``'s consumer group committed, by partition (none: absent)."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    config = parse_kafka_url(url)
    admin = AdminClient({**config.common, "bootstrap.servers": config.bootstrap})
    request = ConsumerGroupTopicPartitions(config.group_id(queue_name))
    (future,) = admin.list_consumer_group_offsets([request]).values()
    result = future.result(timeout=10)
    return {tp.partition: tp.offset for tp in result.topic_partitions if tp.offset >= 0}
