"""The Kafka broker under real ``dramatiq`` worker processes, on Tansu.

Plain Dramatiq actors (``tests/integration/kafka_worker.py``) record every delivery in
PostgreSQL, with the Kafka partition and offset it came from; workers die by SIGKILL,
and a second worker joining the group forces real rebalances.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import dramatiq
import psycopg
import pytest

from estafeta_brokers import broker_from_url
from estafeta_brokers.kafka import KafkaBroker
from estafeta_brokers.kafka_config import parse_kafka_url

from ..helpers import scalar, wait_until
from ..kafka_server import with_topic_prefix
from ..kafka_support import committed_offsets, read_topic
from . import processes

pytestmark = [pytest.mark.integration, pytest.mark.heavy]

WORKER = "tests.integration.kafka_worker"

#: The tables the worker module records deliveries in.
TABLES = """
DROP SCHEMA IF EXISTS kafkacheck CASCADE;
CREATE SCHEMA kafkacheck;
CREATE TABLE kafkacheck.deliveries (
    id bigserial PRIMARY KEY, message_id text NOT NULL, seq int NOT NULL, run text NOT NULL,
    kafka_partition int, kafka_offset bigint, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE kafkacheck.done (
    id bigserial PRIMARY KEY, seq int NOT NULL, run text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp());
"""


@pytest.fixture
def kafkacheck(database_url: str) -> str:
    """The run's database with fresh ``kafkacheck`` tables."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(TABLES)
    return database_url


def one_partition(url: str) -> str:
    """``url`` whose new topics have one partition: one offset order for the whole queue."""
    return f"{url}&partitions=1"


def send(url: str, *seqs: int, fail_times: int = 0, actor: str = "kafkacheck.record") -> list[str]:
    """Enqueue one ``record`` message per seq, through the broker's own ``enqueue``; return their ids."""
    broker = broker_from_url(url)
    try:
        messages = [
            dramatiq.Message(
                queue_name="kafkacheck", actor_name=actor, args=(seq,), kwargs={"fail_times": fail_times}, options={}
            )
            for seq in seqs
        ]
        for message in messages:
            broker.enqueue(message)
        return [m.message_id for m in messages]
    finally:
        broker.close()


def worker(url: str, database_url: str, tmp_path: Path, run: str = "1", **knobs: str) -> processes.Process:
    env = processes.service_env(database_url, url, KAFKACHECK_RUN=run, **knobs)
    return processes.workers(env, tmp_path, module=WORKER, threads=4)


def done(conn: psycopg.Connection[Any]) -> list[int]:
    return [r[0] for r in conn.execute("SELECT seq FROM kafkacheck.done ORDER BY id").fetchall()]


def deliveries(conn: psycopg.Connection[Any], run: str | None = None) -> Counter[int]:
    query = "SELECT seq FROM kafkacheck.deliveries" + (" WHERE run = %s" if run else "")
    return Counter(r[0] for r in conn.execute(query, (run,) if run else ()).fetchall())


def test_enqueued_messages_are_processed_once_each(kafka_url, kafkacheck, conn, tmp_path: Path) -> None:
    send(kafka_url, *range(50))
    with processes.running(worker(kafka_url, kafkacheck, tmp_path)):
        wait_until(lambda: len(done(conn)) == 50, timeout=60, what="every message processed")
    assert sorted(done(conn)) == list(range(50))
    assert deliveries(conn) == Counter(range(50))  # nothing delivered twice


def test_a_retry_goes_through_the_delay_topic_and_does_not_hold_the_partition(
    kafka_url, kafkacheck, conn, tmp_path: Path
) -> None:
    url = one_partition(kafka_url)
    (failing,) = send(url, 0, fail_times=2)
    send(url, *range(1, 11))
    with processes.running(worker(url, kafkacheck, tmp_path)):
        wait_until(lambda: 0 in done(conn), timeout=60, what="the message that failed twice")
        wait_until(lambda: len(done(conn)) == 11, timeout=30)
    assert deliveries(conn)[0] == 3  # two failures, then the success
    # The later messages of its partition did not wait for its retries.
    assert done(conn)[-1] == 0
    delayed = [r.message() for r in read_topic(url, "kafkacheck.DQ")]
    assert [m.message_id for m in delayed] == [failing, failing]
    assert all("eta" in m.options for m in delayed)


def test_exhausted_unknown_and_undecodable_messages_are_dead_lettered_with_their_reason(
    kafka_url, kafkacheck, conn, tmp_path: Path
) -> None:
    (exhausted,) = send(kafka_url, 0, fail_times=-1)
    (unknown,) = send(kafka_url, 1, actor="kafkacheck.nobody")
    broker = broker_from_url(kafka_url)
    assert isinstance(broker, KafkaBroker)
    broker.produce(broker.config.topic("kafkacheck"), b"\xff not a dramatiq message", key=b"k")
    broker.close()
    with processes.running(worker(kafka_url, kafkacheck, tmp_path)):
        wait_until(lambda: len(read_topic(kafka_url, "kafkacheck.XQ")) == 3, timeout=60, what="three dead letters")
        send(kafka_url, 2)  # the worker keeps serving
        wait_until(lambda: done(conn) == [2], timeout=30)
    letters = read_topic(kafka_url, "kafkacheck.XQ")
    reasons = {r.headers.get("message_id", b"").decode(): r for r in letters}
    assert b"RuntimeError: boom: seq 0, attempt 3" in reasons[exhausted].headers["dead_letter_reason"]
    assert reasons[exhausted].message().options["retries"] == 3
    assert b"ActorNotFound" in reasons[unknown].headers["dead_letter_reason"]
    (garbage,) = [r for r in letters if r.key == b"k"]
    assert garbage.value == b"\xff not a dramatiq message"
    assert garbage.headers["dead_letter_reason"].startswith(b"undecodable message")
    assert deliveries(conn)[0] == 3


def test_a_killed_worker_commits_only_below_its_lowest_unfinished_message(
    kafka_url, kafkacheck, conn, tmp_path: Path
) -> None:
    url = one_partition(kafka_url)
    send(url, *range(30))
    first = worker(url, kafkacheck, tmp_path, run="1", KAFKACHECK_HOLD="5,12")
    with processes.running(first):
        # Threads finish out of order: everything but 5 and 12 is done, 5 and 12 never will be.
        wait_until(lambda: len(done(conn)) == 28, timeout=60, what="every message but the two held")
        wait_until(lambda: committed_offsets(url, "kafkacheck") == {0: 5}, timeout=10, what="the commit up to 5")
        first.kill(signal.SIGKILL)
        first.popen.wait(10)
    second = worker(url, kafkacheck, tmp_path, run="2")
    with processes.running(second):
        wait_until(lambda: {5, 12} <= set(done(conn)), timeout=60, what="the unfinished messages, redelivered")
        wait_until(lambda: sum(deliveries(conn, "2").values()) == 25, timeout=30)
        wait_until(lambda: committed_offsets(url, "kafkacheck") == {0: 30}, timeout=10)
    # Redelivered: from the lowest unfinished offset on (the finished ones above it are copies
    # an inbox absorbs); nothing below it.
    assert deliveries(conn, "2") == Counter(range(5, 30))
    assert sorted(set(done(conn))) == list(range(30))


def test_a_rebalance_lets_in_flight_messages_finish_and_commits_them(
    kafka_url, kafkacheck, conn, tmp_path: Path
) -> None:
    url = one_partition(kafka_url) + "&rebalance_grace_ms=15000"
    send(url, *range(10))
    first = worker(url, kafkacheck, tmp_path, run="1", KAFKACHECK_SLOW="3", KAFKACHECK_SLOW_SECONDS="8")
    with processes.running(first):
        wait_until(lambda: deliveries(conn)[3] == 1, timeout=60, what="the slow message taken")
        with processes.running(worker(url, kafkacheck, tmp_path, run="2")):  # joins: a rebalance
            wait_until(lambda: sorted(done(conn)) == list(range(10)), timeout=60)
            wait_until(lambda: committed_offsets(url, "kafkacheck") == {0: 10}, timeout=30)
            send(url, 10)  # whoever owns the partition now takes it
            wait_until(lambda: 10 in done(conn), timeout=30)
        log = first.output()
    # The rebalance came while the slow message ran; it finished inside the grace and was committed.
    assert "waiting up to 15s for 1 unfinished message(s)" in log
    assert deliveries(conn) == Counter(range(11))  # so nobody delivered anything twice


def test_a_rebalance_abandons_what_does_not_finish_in_time_and_never_commits_it(
    kafka_url, kafkacheck, conn, tmp_path: Path
) -> None:
    url = one_partition(kafka_url) + "&rebalance_grace_ms=500"
    send(url, *range(10))
    first = worker(url, kafkacheck, tmp_path, run="1", KAFKACHECK_HOLD="3")
    with processes.running(first):
        wait_until(lambda: len(done(conn)) == 9, timeout=60, what="all but the held message")
        with processes.running(worker(url, kafkacheck, tmp_path, run="2")):  # joins: a rebalance
            # Abandoned, not committed: whoever owns the partition next delivers it again.
            wait_until(lambda: deliveries(conn)[3] >= 2, timeout=60, what="the held message, delivered again")
            first.kill(signal.SIGKILL)  # if it went back to the first worker, which holds it again
            wait_until(lambda: 3 in done(conn), timeout=60, what="the held message, done by the second worker")
        log = first.output()
    assert "abandoning unfinished messages" in log
    assert all(deliveries(conn)[seq] == 1 for seq in range(3))  # below it: committed, never again
    assert sorted(set(done(conn))) == list(range(10))
    assert scalar(conn, "SELECT count(*) FROM kafkacheck.done WHERE seq = 3") == 1


def test_sigterm_lets_the_running_message_finish_and_commits_it(kafka_url, kafkacheck, conn, tmp_path: Path) -> None:
    url = one_partition(kafka_url)
    send(url, *range(10))
    first = worker(url, kafkacheck, tmp_path, run="1", KAFKACHECK_SLOW="9", KAFKACHECK_SLOW_SECONDS="3")
    with processes.running(first):
        wait_until(lambda: deliveries(conn)[9] == 1, timeout=60, what="the slow message taken")
        os.kill(first.popen.pid, signal.SIGTERM)  # to dramatiq's main process, which stops its workers
        assert first.popen.wait(30) == 0
    assert sorted(done(conn)) == list(range(10))  # it finished before the worker exited...
    assert committed_offsets(url, "kafkacheck") == {0: 10}  # ...and its offset was committed
    send(url, 10)
    with processes.running(worker(url, kafkacheck, tmp_path, run="2")):
        wait_until(lambda: 10 in done(conn), timeout=60)
    assert deliveries(conn, "2") == Counter([10])  # nothing came twice


def test_a_dead_letter_kafka_refuses_does_not_stop_the_partition(kafka_url, kafkacheck, conn, tmp_path: Path) -> None:
    url = one_partition(kafka_url)
    broker = broker_from_url(url)
    big = dramatiq.Message(
        queue_name="kafkacheck", actor_name="kafkacheck.nobody", args=("x" * 5000,), kwargs={}, options={}
    )
    broker.enqueue(big)  # fine for Kafka, too large for the workers' producer below
    broker.close()
    send(url, 1)
    small_producer = url + "&producer.message.max.bytes=2000"
    first = worker(small_producer, kafkacheck, tmp_path)
    with processes.running(first):
        wait_until(lambda: done(conn) == [1], timeout=60, what="the message behind the refused dead letter")
        wait_until(lambda: committed_offsets(url, "kafkacheck") == {0: 2}, timeout=30, what="the offset past both")
        log = first.output()
    assert f"cannot dead-letter {parse_kafka_url(url).topic('kafkacheck')}[0]@0" in log
    assert "stays in that topic until its retention ends" in log


def test_a_worker_busy_for_longer_than_max_poll_interval_keeps_its_partitions(
    kafka_url, kafkacheck, conn, tmp_path: Path
) -> None:
    # One thread (prefetch 2), messages of 4 s each, and librdkafka's liveness limit at 3 s:
    # a consumer that stopped polling while full would be thrown out of its group, and its
    # unfinished messages delivered again.
    url = one_partition(kafka_url) + "&consumer.max.poll.interval.ms=3000"
    send(url, *range(4))
    env = processes.service_env(kafkacheck, url, KAFKACHECK_SLOW="0,1,2", KAFKACHECK_SLOW_SECONDS="4")
    first = processes.workers(env, tmp_path, module=WORKER, threads=1)
    with processes.running(first):
        wait_until(lambda: sorted(done(conn)) == list(range(4)), timeout=60, what="the slow messages, one by one")
        log = first.output()
    assert deliveries(conn) == Counter(range(4))  # nothing delivered twice
    assert "revoked" not in log and "lost" not in log and "MAXPOLL" not in log


def test_a_retry_kafka_does_not_take_is_produced_again_before_the_message_is_acknowledged(
    tansu_node, kafkacheck, conn, tmp_path: Path
) -> None:
    # Dramatiq's Retries middleware produces the retry from a hook that swallows errors, and the
    # message is then acknowledged: a retry Kafka did not take (no ack within the delivery
    # timeout: a frozen broker here, too few in-sync replicas on a cluster) would be lost.
    url = with_topic_prefix(tansu_node.url + "&partitions=1&consumer.session.timeout.ms=10000")
    assert tansu_node.process is not None
    send(url, 0, fail_times=1)
    env = processes.service_env(
        kafkacheck, url, KAFKACHECK_SLOW="0", KAFKACHECK_SLOW_SECONDS="1", KAFKACHECK_DELIVERY_TIMEOUT="1"
    )
    first = processes.workers(env, tmp_path, module=WORKER, threads=1)
    with processes.running(first):
        wait_until(lambda: deliveries(conn)[0] == 1, timeout=60, what="the first attempt")
        os.kill(tansu_node.process.pid, signal.SIGSTOP)  # the attempt fails while Kafka takes nothing
        try:
            failed = "Unexpected failure in after_process_message"  # Dramatiq's log of the swallowed error
            wait_until(lambda: failed in first.output(), timeout=30, what="the retry Kafka did not take")
            # The acknowledgement produces it again, and waits (Dramatiq tries again) while Kafka takes nothing.
            held = "Failed to post_process_message"
            wait_until(lambda: held in first.output(), timeout=30, what="the acknowledgement held back")
            assert deliveries(conn)[0] == 1 and done(conn) == []
        finally:
            os.kill(tansu_node.process.pid, signal.SIGCONT)
        wait_until(lambda: done(conn) == [0], timeout=60, what="the retry, once Kafka is back")
        wait_until(lambda: committed_offsets(url, "kafkacheck") == {0: 2}, timeout=30, what="both offsets committed")
    assert deliveries(conn)[0] == 2  # the failed attempt, then its retry: nothing lost, nothing doubled
    assert len(read_topic(url, "kafkacheck.DQ")) == 1
