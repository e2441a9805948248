"""The relay and the order system's steps on Kafka (Tansu), with real processes killed at the worst moments.

The same step modules as on RabbitMQ and Redis (``dramatiq actors``), the same ``estafeta
relay``; only ``ESTAFETA_BROKER_URL`` says ``kafka://``. Relays die by SIGKILL at a state the
test waited for; the broker dies by SIGKILL and comes back (Tansu keeps its data in
memory, so it comes back empty: what counts is that the rows written meanwhile wait and
then go out). Nothing is lost; copies are absorbed by the consumers' inbox.
"""

from __future__ import annotations

import random
import signal
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from actors.pingpong import Ping
from brokers import broker_from_url
from brokers.kafka_config import parse_kafka_url
from sql import inbox

from ..helpers import message_for, now, scalar, wait_until
from ..kafka_support import read_topic
from ..relay_support import add, arrivals, check_order
from . import processes
from .relay_faults import blackhole, relay_waits_to_delete, unlocked_rows

pytestmark = pytest.mark.integration


def pings(conn: psycopg.Connection[object], count: int) -> None:
    from actors import outbox

    with conn.transaction():
        for _ in range(count):
            outbox.send(conn, Ping(uuid.uuid4(), now()), service="pingpong")


def all_ponged_once(conn: psycopg.Connection[object], count: int) -> bool:
    return scalar(conn, "SELECT count(*) FROM pingpong.pings WHERE pongs = 1") == count


def relay_in_batch(conn: psycopg.Connection[object]) -> bool:
    """Whether a relay of this database is inside a batch transaction (claimed, publishing, deleting)."""
    return bool(
        scalar(
            conn,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'estafeta-relay' AND state = 'idle in transaction'",
        )
    )


def queue_arrivals(url: str, queue: str) -> list[tuple[str | None, int, str]]:
    """``(key, seq, message_id)`` of every record of ``queue``, partition by partition, in offset order.

    Order is only defined within a partition, and all of a key's records share one.
    """
    return arrivals(r.message() for r in read_topic(url, queue))


def test_step_module_runs_unchanged_on_kafka(kafka_url, database_url, runtime, conn, tmp_path: Path) -> None:
    env = processes.service_env(database_url, kafka_url)
    pings(conn, 20)
    with processes.running(processes.workers(env, tmp_path), processes.relay(env, tmp_path)):
        wait_until(lambda: all_ponged_once(conn, 20), timeout=90, what="every ping answered once")
    assert scalar(conn, "SELECT max(pongs) FROM pingpong.pings") == 1
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0


def test_malformed_message_is_dead_lettered_by_its_step_and_the_worker_keeps_serving(
    kafka_url, database_url, runtime, conn, tmp_path: Path
) -> None:
    env = processes.service_env(database_url, kafka_url)
    broker = broker_from_url(kafka_url)
    bad = message_for("pingpong.ping", Ping(uuid.uuid4(), now())).copy(args=({"ping_id": "nope"},))
    with processes.running(processes.workers(env, tmp_path), processes.relay(env, tmp_path)):
        broker.enqueue(bad)
        pings(conn, 3)
        wait_until(lambda: all_ponged_once(conn, 3), timeout=90, what="the good pings after the bad one")
        wait_until(lambda: bool(inbox.list_dead_letters(conn, "pingpong")), timeout=30, what="the dead letter")
    broker.close()
    (letter,) = inbox.list_dead_letters(conn, "pingpong")
    assert letter["message_id"] == bad.message_id
    assert "ping_id" in letter["reason"] and "sent_at" in letter["reason"]


def test_relay_killed_after_the_delivery_report_before_the_delete(
    kafka_url, database_url, runtime, conn, tmp_path: Path
) -> None:
    env = processes.service_env(database_url, kafka_url)
    pings(conn, 20)
    with psycopg.connect(database_url) as locker:
        # The relay can claim (ROW SHARE) and publish, but its DELETE waits for this lock.
        locker.execute("LOCK TABLE pingpong.outbox IN SHARE MODE")
        first = processes.relay(env, tmp_path)
        with processes.running(first):
            wait_until(lambda: relay_waits_to_delete(conn), timeout=30, what="the relay blocked in its DELETE")
            first.kill(signal.SIGKILL)
            first.popen.wait(10)
        locker.rollback()
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 20  # acknowledged by Kafka, yet not deleted
    assert len(read_topic(kafka_url, "pingpong")) == 20
    workers = processes.workers(env, tmp_path)
    with processes.running(workers, processes.relay(env, tmp_path)):
        wait_until(lambda: all_ponged_once(conn, 20), timeout=90, what="every ping answered")
        # Each ping came twice and took effect once.
        wait_until(lambda: workers.output().count("duplicate delivery of") == 20, timeout=30, what="the copies")
    assert scalar(conn, "SELECT max(pongs) FROM pingpong.pings") == 1


def test_relay_killed_after_claiming_before_publishing(kafka_url, database_url, runtime, conn, tmp_path: Path) -> None:
    pings(conn, 20)
    with blackhole() as port:
        # A "broker" that accepts the connection and never answers: the relay claims its
        # batch, then waits on Kafka.
        env = processes.service_env(database_url, f"kafka://127.0.0.1:{port}")
        first = processes.relay(env, tmp_path)
        with processes.running(first):
            wait_until(lambda: unlocked_rows(conn) == 0, timeout=30, what="the relay holding its claim")
            first.kill(signal.SIGKILL)
            first.popen.wait(10)
    env = processes.service_env(database_url, kafka_url)
    workers = processes.workers(env, tmp_path)
    with processes.running(workers, processes.relay(env, tmp_path)):
        wait_until(lambda: all_ponged_once(conn, 20), timeout=90, what="every ping answered")
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0, timeout=30)
        assert "duplicate delivery" not in workers.output()  # nothing had left before the kill
    assert scalar(conn, "SELECT max(pongs) FROM pingpong.pings") == 1


def test_three_relays_killed_at_random_keep_every_key_in_order(kafka_url, database_url, runtime, conn, tmp_path):
    env = processes.service_env(database_url, kafka_url, ESTAFETA_RELAY_BATCH_SIZE="10")
    queue = f"relaycheck_{uuid.uuid4().hex[:8]}"
    keys = [f"k{i}" for i in range(40)]
    expected: dict[str | None, list[int]] = {key: [] for key in keys}
    relays = [processes.relay(env, tmp_path) for _ in range(3)]
    stop = threading.Event()
    kills = {"all": 0, "inside a batch": 0}

    def write() -> None:
        with psycopg.connect(database_url, autocommit=True) as writer:
            for seq in range(25):
                with writer.transaction():  # bursts: a backlog for the relays to be busy with
                    for key in random.sample(keys, k=30):
                        add(writer, key, seq, queue=queue)
                        expected[key].append(seq)
                time.sleep(0.25)

    def kill_at_random() -> None:
        with psycopg.connect(database_url, autocommit=True) as watcher:
            while not stop.wait(random.uniform(0.3, 0.8)):
                deadline = time.monotonic() + 1
                while time.monotonic() < deadline and not relay_in_batch(watcher):
                    time.sleep(0.002)
                kills["inside a batch"] += relay_in_batch(watcher)
                for i, relay in enumerate(relays):
                    relay.kill(signal.SIGKILL)
                    relay.stop()
                    relays[i] = processes.relay(env, tmp_path)
                kills["all"] += 1

    killer = threading.Thread(target=kill_at_random)
    try:
        killer.start()
        write()
    finally:
        stop.set()
        killer.join()
    with processes.running(*relays):
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0, timeout=90)
    duplicates = check_order(queue_arrivals(kafka_url, queue), expected)
    assert kills["all"] >= 3
    print(f"relays killed {kills}; {duplicates} rows published twice")


def test_sigterm_finishes_the_batch_in_hand_and_loses_nothing(kafka_url, database_url, runtime, conn, tmp_path):
    env = processes.service_env(database_url, kafka_url, ESTAFETA_RELAY_BATCH_SIZE="50")
    queue = f"relaycheck_{uuid.uuid4().hex[:8]}"
    with conn.transaction():
        for seq in range(3000):
            add(conn, f"k{seq % 7}", seq, queue=queue)
    relay = processes.relay(env, tmp_path)
    with processes.running(relay):
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM pingpong.outbox") < 2900, timeout=30)
        relay.kill(signal.SIGTERM)
        assert relay.popen.wait(10) == 0
    assert processes.estafeta(env, "relay", "--once").returncode == 0
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0
    expected = {f"k{k}": list(range(k, 3000, 7)) for k in range(7)}
    assert check_order(queue_arrivals(kafka_url, queue), expected) == 0


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
