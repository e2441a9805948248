"""The relay's Kafka publisher against a real Kafka-protocol broker (Tansu): records, refusals, outages."""

from __future__ import annotations

import os
import signal
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic  # type: ignore[attr-defined]

from estafeta_brokers import broker_from_url
from estafeta_brokers.kafka import KafkaBroker, KafkaUnreachable
from estafeta_brokers.kafka_config import parse_kafka_url
from estafeta_brokers.kafka_publish import KafkaPublisher, _Batch
from estafeta_brokers.kafka_topics import is_unreachable
from estafeta_brokers.publish import publisher_for, to_message
from estafeta_sql.outbox import OutboxRow

from .integration.relay_faults import blackhole
from .kafka_server import with_topic_prefix
from .kafka_support import read_topic


def row(seq: int, *, key: str | None = None, queue: str = "relaycheck", size: int = 0) -> OutboxRow:
    return OutboxRow(
        id=seq,
        message_id=uuid.uuid4(),
        queue_name=queue,
        actor_name=f"{queue}.record",
        message={
            "args": [{"key": key, "seq": seq, "padding": "x" * size}],
            "kwargs": {},
            "options": {"traceparent": f"00-{seq:032x}-{seq:016x}-01", "saga_id": f"saga-{seq}"},
        },
        ordering_key=key,
        saga_id=uuid.UUID(int=seq),
        created_at=datetime.now(UTC),
        attempts=0,
    )


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def publisher(kafka_url: str) -> Iterator[KafkaPublisher]:
    broker = broker_from_url(kafka_url + "&partitions=3")
    publisher = publisher_for(broker, confirm_timeout=5)
    assert isinstance(publisher, KafkaPublisher)
    yield publisher
    publisher.close()


def test_a_batch_is_dramatiqs_encoding_keyed_by_ordering_key_with_saga_headers(publisher, kafka_url) -> None:
    rows = [row(i, key=f"k{i % 7}" if i % 10 else None) for i in range(300)]
    outcome = publisher.publish(rows)
    assert outcome.confirmed == [r.id for r in rows] and not outcome.failed and outcome.broker_error is None
    records = read_topic(kafka_url, "relaycheck")
    assert {r.partition for r in records} == {0, 1, 2}  # the configured partitions
    by_id = {str(r.message_id): r for r in rows}
    partitions_of_key: dict[bytes | None, set[int]] = defaultdict(set)
    order_of_key: dict[bytes | None, list[int]] = defaultdict(list)
    for record in records:
        sent = by_id[record.headers["message_id"].decode()]
        assert record.value == to_message(sent).encode()  # byte for byte Dramatiq's
        assert record.key == (sent.ordering_key.encode() if sent.ordering_key else None)
        assert record.headers["saga_id"] == str(sent.saga_id).encode()
        assert record.headers["traceparent"] == sent.message["options"]["traceparent"].encode()
        partitions_of_key[record.key].add(record.partition)
        order_of_key[record.key].append(sent.id)
    assert len(records) == 300
    for key in (k for k in partitions_of_key if k is not None):
        assert len(partitions_of_key[key]) == 1  # one partition per key...
        assert order_of_key[key] == sorted(order_of_key[key])  # ...in commit order


def test_refused_rows_count_an_attempt_and_hold_only_their_key(kafka_url) -> None:
    publisher = publisher_for(broker_from_url(kafka_url + "&producer.message.max.bytes=20000"), confirm_timeout=5)
    rows = [
        row(1, key="a", queue="bad/queue"),  # Kafka refuses the topic name
        row(2, key="a"),
        row(3, key="b", size=50_000),  # larger than the producer may send
        row(4, key="b"),
        row(5, key="c"),
        row(6),
    ]
    outcome = publisher.publish(rows)
    assert outcome.confirmed == [5, 6] and outcome.broker_error is None
    assert sorted(outcome.failed) == [1, 3]  # rows 2 and 4 wait behind them, no attempt counted
    assert "bad/queue' has characters Kafka refuses" in outcome.failed[1]
    assert "Message size too large" in outcome.failed[3]
    assert publisher.publish([row(7, key="d")]).confirmed == [7]
    publisher.close()


def test_topics_estafeta_creates_get_the_partitions_and_in_sync_replicas_of_the_url(kafka_url) -> None:
    url = kafka_url + "&partitions=12&replication_factor=3&min_insync_replicas=2"
    publisher = publisher_for(broker_from_url(url), confirm_timeout=5)
    assert publisher.publish([row(1, key="a")]).confirmed == [1]
    publisher.close()
    config = parse_kafka_url(url)
    admin = AdminClient({"bootstrap.servers": config.bootstrap})
    for name in ("relaycheck", "relaycheck.DQ", "relaycheck.XQ"):
        topic = config.topic(name)
        assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 12
        (described,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
        assert described.result(10)["min.insync.replicas"].value == "2"


def test_an_existing_topic_is_used_as_it_is(kafka_url) -> None:
    config = parse_kafka_url(kafka_url)
    admin = AdminClient({"bootstrap.servers": config.bootstrap})
    for future in admin.create_topics([NewTopic(config.topic("relaycheck"), num_partitions=1)]).values():
        future.result(10)
    publisher = publisher_for(broker_from_url(kafka_url + "&partitions=4"), confirm_timeout=5)
    assert publisher.publish([row(1, key="a"), row(2, key="b")]).confirmed == [1, 2]
    publisher.close()
    assert {r.partition for r in read_topic(kafka_url, "relaycheck")} == {0}


def test_an_unreachable_cluster_leaves_rows_pending_without_blame() -> None:
    publisher = publisher_for(broker_from_url(f"kafka://127.0.0.1:{closed_port()}"), confirm_timeout=2)
    started = time.monotonic()
    outcome = publisher.publish([row(1, key="a"), row(2)])
    assert outcome.confirmed == [] and outcome.failed == {}
    assert "cannot reach Kafka at 127.0.0.1:" in (outcome.broker_error or "")
    assert time.monotonic() - started < 10
    publisher.close()


def test_a_broker_that_never_answers_leaves_rows_pending_without_blame() -> None:
    with blackhole() as port:
        publisher = publisher_for(broker_from_url(f"kafka://127.0.0.1:{port}"), confirm_timeout=2)
        outcome = publisher.publish([row(1, key="a"), row(2)])
        publisher.close()
    assert outcome.confirmed == [] and outcome.failed == {}
    assert outcome.broker_error


def test_enqueue_waits_for_kafka_and_a_delay_goes_to_the_delay_topic(kafka_url) -> None:
    broker = broker_from_url(kafka_url)
    message = to_message(row(1, key="a"))
    broker.enqueue(message)
    delayed = broker.enqueue(message, delay=60_000)
    broker.close()
    (plain,) = read_topic(kafka_url, "relaycheck")
    (later,) = read_topic(kafka_url, "relaycheck.DQ")
    assert plain.value == message.encode()
    assert later.message().options["eta"] == delayed.options["eta"] >= time.time() * 1000 + 50_000
    assert later.headers["traceparent"] == message.options["traceparent"].encode()


def test_a_record_kafka_never_acknowledges_is_an_outage_for_enqueue_not_a_refusal(tansu_node) -> None:
    # Tansu frozen (SIGSTOP): the record is never acknowledged, librdkafka reports _MSG_TIMED_OUT
    # when the delivery timeout runs out. That is the cluster's state, not the record's: a worker
    # retrying a message, or dead-lettering one, must try again later (KafkaUnreachable), never
    # treat the record as refused (KafkaRefused), which would move the offset past a dead letter
    # that Kafka does not have.
    broker = broker_from_url(with_topic_prefix(tansu_node.url))
    assert isinstance(broker, KafkaBroker)
    broker.delivery_timeout = 2
    message = to_message(row(1, key="a"))
    broker.enqueue(message)  # topics made, producer connected
    assert tansu_node.process is not None
    os.kill(tansu_node.process.pid, signal.SIGSTOP)
    try:
        with pytest.raises(KafkaUnreachable, match="Message timed out"):
            broker.enqueue(message)
    finally:
        os.kill(tansu_node.process.pid, signal.SIGCONT)
        broker.close()


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.KAFKA_STORAGE_ERROR,
        KafkaError._MSG_TIMED_OUT,
    ],
)
def test_too_few_in_sync_replicas_leave_the_row_pending_without_blame(code: int) -> None:
    # A replicated topic with fewer in-sync replicas than min.insync.replicas answers acks=all
    # with NOT_ENOUGH_REPLICAS; librdkafka retries it until message.timeout.ms, and reports it
    # if `retries` was lowered. Tansu keeps one copy and never answers it, so the report is made
    # here as confluent-kafka makes a delivery report's error (without the retriable flag).
    batch = _Batch()
    waiting, too_big = row(1, key="a"), row(2, key="b")
    batch.produced += [waiting, too_big]
    batch.report(waiting, "payments", KafkaError(code))
    batch.report(too_big, "payments", KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    assert batch.outage and "payments" in batch.outage  # an outage: no attempt counted, the row stays
    assert list(batch.failed) == [too_big.id]  # while a refusal of the record itself still counts
    assert batch.delivered == set()
    assert is_unreachable(KafkaError(code))  # so the workers' enqueue and dead letters wait too
