"""The relay on Kafka (Tansu) where Kafka differs from the other brokers: its broker dies, its topics.

The relay's fault tests shared with RabbitMQ and Redis (test_relay_faults.py) and the
step modules on every broker (test_brokers.py) run on Kafka too. Here the broker itself
dies by SIGKILL and comes back (Tansu keeps its data in memory, so it comes back empty:
what counts is that the rows written meanwhile wait, without an attempt counted, and
then go out), and the relay creates the topics the workers expect.
"""

from __future__ import annotations

import signal

import pytest
from confluent_kafka.admin import AdminClient

from estafeta_brokers.kafka_config import parse_kafka_url

from ..helpers import scalar, wait_until
from ..kafka_support import read_topic
from ..relay_support import add, arrivals, check_order
from . import processes

pytestmark = pytest.mark.integration


def queue_arrivals(url: str, queue: str) -> list[tuple[str | None, int, str]]:
    """``(key, seq, message_id)`` of every record of ``queue``, partition by partition, in offset order.

    Order is only defined within a partition, and all of a key's records share one.
    """
    return arrivals(r.message() for r in read_topic(url, queue))


@pytest.mark.heavy
def test_rows_wait_out_a_kafka_outage_and_go_out_after_it(tansu_node, database_url, runtime, conn, tmp_path):
    url = tansu_node.url + "&topic_prefix=outage."
    env = processes.service_env(database_url, url)
    relay = processes.relay(env, tmp_path)
    pending = "SELECT count(*) FROM pingpong.outbox"
    with processes.running(relay):
        for seq in range(10):
            add(conn, f"k{seq % 3}", seq)
        wait_until(lambda: scalar(conn, pending) == 0, timeout=30, what="the rows before the outage")
        tansu_node.kill()  # SIGKILL: the broker is gone, and its memory with it
        try:
            for seq in range(10, 30):
                add(conn, f"k{seq % 3}", seq)
            wait_until(lambda: "relay paused" in relay.output(), timeout=60, what="the relay noticing the outage")
            # An outage is not the rows' fault: nothing counted against them, nothing failed.
            assert scalar(conn, "SELECT count(*) FROM pingpong.outbox WHERE attempts = 0 AND status = 'pending'") == 20
            assert relay.popen.poll() is None
        finally:
            tansu_node.start()  # the same port, empty
        wait_until(lambda: scalar(conn, pending) == 0, timeout=90, what="the rows after the outage")
        # Not after it either: the restarted broker forgot the producer's sequences, which is
        # the producer's problem (it is replaced), not the rows'.
        assert "the broker refused" not in relay.output()
        relay.kill(signal.SIGTERM)  # a relay that went through an outage still stops cleanly
        assert relay.popen.wait(15) == 0
    # What was published before the outage died with Tansu's memory; every row written
    # during the outage arrived, each key in order.
    expected = {f"k{k}": [s for s in range(10, 30) if s % 3 == k] for k in range(3)}
    assert check_order(queue_arrivals(url, "relaycheck"), expected) == 0


def test_the_relay_creates_the_topics_with_the_configured_partitions(kafka_url, database_url, runtime, conn, tmp_path):
    url = kafka_url + "&partitions=4"
    env = processes.service_env(database_url, url)
    for seq in range(40):
        add(conn, f"k{seq}", seq)
    assert processes.estafeta(env, "relay", "--once").returncode == 0
    records = read_topic(url, "relaycheck")
    assert len(records) == 40 and {r.partition for r in records} == {0, 1, 2, 3}
    config = parse_kafka_url(url)
    topics = AdminClient({"bootstrap.servers": config.bootstrap}).list_topics(timeout=10).topics
    for name in ("relaycheck", "relaycheck.DQ", "relaycheck.XQ"):  # as the workers expect them
        assert len(topics[config.topic(name)].partitions) == 4
