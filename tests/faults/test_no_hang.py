"""No hang: every client estafeta opens notices a silent cut within the bound the docs state, then recovers.

A client runs in a namespace of its own (``client_probe``: estafeta's ``Database`` pool,
the brokers ``broker_from_url`` builds and Dramatiq's consumers on them), its server in
another. The test cuts the link between them with a silent drop while the client waits
for an answer, and expects the call to fail within the documented bound plus a generous
margin for a loaded machine; without estafeta's timeouts the same call waits for the
kernel's TCP timeout (15 minutes or more; a minute or two for RabbitMQ's server-chosen
heartbeat), so the test would fail at the deadline. After the heal, the same client
works again without being restarted.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from estafeta_brokers.liveness import SILENT_FAILURE_BOUND as BROKER_BOUND
from estafeta_sql.liveness import SILENT_FAILURE_BOUND as POSTGRES_BOUND

from ..pg_servers import private_postgres
from ..redis_servers import redis_servers
from .network import Network, Node, inside

pytestmark = [pytest.mark.heavy, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
#: What a loaded 2-core machine may add to a bound (scheduling, pika's timers, retries).
MARGIN = 20.0


class Probe:
    """``client_probe`` in ``node``'s namespace: send a command, read its answer (or time out)."""

    def __init__(self, node: Node, kind: str, url: str) -> None:
        argv = node.command(sys.executable, "-m", "tests.faults.client_probe", kind, url)
        self.process = subprocess.Popen(
            argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self._output: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        ready = self._read(120)
        assert ready.get("command") == "ready", ready

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def answer(self, timeout: float) -> dict[str, Any]:
        """The next answer, or an assertion error naming what the client printed meanwhile."""
        return self._read(timeout)

    def _read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self._output.get(timeout=remaining)
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
            if line.startswith("{"):
                answer: dict[str, Any] = json.loads(line)
                return answer
        raise AssertionError(f"no answer within {timeout:g} s; the client printed:\n{''.join(self.lines)[-3000:]}")

    def _pump(self) -> None:
        # A thread of its own reads the output: a selector on a buffered pipe misses lines
        # already read into the buffer.
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._output.put(line)
        self._output.put(None)

    def line_with(self, wanted: Callable[[str], bool], timeout: float) -> str:
        """The next line the client prints that is ``wanted``; an assertion error after ``timeout``."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self._output.get(timeout=remaining)
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
            if wanted(line):
                return line
        raise AssertionError(f"no such line within {timeout:g} s; the client printed:\n{''.join(self.lines)[-3000:]}")

    def until_ok(self, command: str, timeout: float) -> dict[str, Any]:
        """Send ``command`` until it succeeds (after a heal); the successful answer."""
        deadline = time.monotonic() + timeout
        while True:
            self.send(command)
            answer = self.answer(max(deadline - time.monotonic(), 1.0) + MARGIN)
            if answer["ok"]:
                return answer
            assert time.monotonic() < deadline, f"{command!r} still fails after the heal: {answer}"
            time.sleep(0.5)

    def close(self) -> None:
        self.process.kill()
        self.process.wait(10)


@contextmanager
def probe(node: Node, kind: str, url: str) -> Iterator[Probe]:
    client = Probe(node, kind, url)
    try:
        yield client
    finally:
        client.close()


def _silent_cut_fails_in_time(net: Network, client: Probe, a: Node, b: Node, command: str, bound: float) -> float:
    """Start ``command``, cut ``a`` from ``b`` while it waits, return how long until it failed."""
    client.send(command)
    time.sleep(1.0)  # the request is out and the client waits for its answer
    net.cut(a, b)
    cut_at = time.monotonic()
    answer = client.answer(bound + MARGIN)
    failed_after = time.monotonic() - cut_at
    assert not answer["ok"], f"{command!r} succeeded across a cut: {answer}"
    print(f"{command!r}: failed {failed_after:.1f} s after the cut (bound {bound} s): {answer['error']}")
    return failed_after


def test_a_postgres_query_waiting_on_a_silent_cut_fails_within_the_bound_and_the_pool_recovers(net: Network) -> None:
    db_node, app = net.add("db"), net.add("app")
    with (
        private_postgres(netns=db_node.netns, host=db_node.address) as server,
        probe(app, "postgres", server.dsn()) as client,
    ):
        client.send("ping")
        assert client.answer(60)["ok"]
        # The server says nothing while it sleeps: only keepalives can tell a silent peer from a slow one.
        _silent_cut_fails_in_time(net, client, app, db_node, "query SELECT pg_sleep(3600)", POSTGRES_BOUND)
        # While cut: a statement on a pooled connection, or a new connection, fails in time as well.
        client.send("ping")
        answer = client.answer(POSTGRES_BOUND + MARGIN)
        assert not answer["ok"], answer
        print(f"ping during the cut: failed after {answer['seconds']:.1f} s: {answer['error']}")
        net.heal(app, db_node)
        healed = time.monotonic()
        client.until_ok("ping", timeout=60)
        print(f"the same pool works again {time.monotonic() - healed:.1f} s after the heal")


def test_a_statement_sent_into_a_silent_cut_fails_within_the_bound(net: Network) -> None:
    db_node, app = net.add("db"), net.add("app")
    with (
        private_postgres(netns=db_node.netns, host=db_node.address) as server,
        probe(app, "postgres", server.dsn()) as client,
    ):
        client.send("ping")
        assert client.answer(60)["ok"]
        net.cut(app, db_node)
        # The pooled connection looks fine; the statement's bytes are never acknowledged (tcp_user_timeout).
        client.send("query SELECT 1")
        answer = client.answer(POSTGRES_BOUND + MARGIN)
        assert not answer["ok"], answer
        print(f"a statement into the cut failed after {answer['seconds']:.1f} s: {answer['error']}")
        net.heal(app, db_node)
        client.until_ok("ping", timeout=60)


def test_the_server_ends_the_session_of_a_client_cut_off_silently_and_frees_its_locks(net: Network) -> None:
    # The client's statement holds a lock while it runs; then the client vanishes without a
    # word. Without estafeta's server-side settings the session runs on (here for an hour),
    # lock held, and every transaction that needs the lock waits after the heal as well.
    db_node, app, observer = net.add("db"), net.add("app"), net.add("observer")
    with (
        private_postgres(netns=db_node.netns, host=db_node.address) as server,
        probe(app, "postgres", server.dsn()) as client,
    ):
        client.send("query SELECT pg_advisory_xact_lock(42), pg_sleep(3600)")
        with inside(observer):
            conn = psycopg.connect(server.dsn(), autocommit=True)
        held = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 42 AND granted"
        with conn:
            deadline = time.monotonic() + 60
            while conn.execute(held).fetchone() != (1,):
                assert time.monotonic() < deadline, "the client never took its lock"
                time.sleep(0.1)
            net.cut(app, db_node)
            cut_at = time.monotonic()
            while conn.execute(held).fetchone() != (0,):
                waited = time.monotonic() - cut_at
                assert waited < POSTGRES_BOUND + MARGIN, (
                    f"the cut-off client's session still holds its lock after {waited:.0f} s"
                )
                time.sleep(0.5)
            print(f"the server ended the cut-off session {time.monotonic() - cut_at:.1f} s after the cut")


def test_a_redis_consumer_on_a_silent_cut_fails_within_the_bound_and_consumes_again_after_the_heal(
    net: Network, tmp_path: Path
) -> None:
    # redis-py 8 times out after 5 s by itself; redis-py 5 to 7 (estafeta supports them) wait
    # forever without the socket_timeout estafeta puts in the URL.
    redis_node, worker = net.add("redis"), net.add("worker")
    with (
        redis_servers(1, tmp_path, netns=redis_node.netns, host=redis_node.address) as (server,),
        probe(worker, "redis", server.url) as client,
    ):
        client.send("consume 2")
        assert client.answer(60)["ok"]
        _silent_cut_fails_in_time(net, client, worker, redis_node, "consume", BROKER_BOUND["redis"])
        net.heal(worker, redis_node)
        client.until_ok("consume 2", timeout=60)


def test_a_rabbitmq_consumer_on_a_silent_cut_fails_within_the_bound_and_consumes_again_after_the_heal(
    net: Network,
) -> None:
    from ..integration.relay_faults import private_rabbitmq

    mq_node, worker = net.add("rabbitmq"), net.add("worker")
    with (
        private_rabbitmq(netns=mq_node.netns, host=mq_node.address) as (url, _),
        probe(worker, "rabbitmq", url) as client,
    ):
        client.send("consume 2")
        assert client.answer(60)["ok"]
        # Without estafeta's heartbeat, the server's (60 s) makes pika notice after 65 to 130 s.
        _silent_cut_fails_in_time(net, client, worker, mq_node, "consume", BROKER_BOUND["amqp"])
        net.heal(worker, mq_node)
        client.until_ok("consume 2", timeout=60)


def test_a_kafka_produce_into_a_silent_cut_fails_within_the_delivery_timeout_and_works_after_the_heal(
    net: Network,
) -> None:
    from estafeta_brokers.kafka import DELIVERY_TIMEOUT

    from ..kafka_server import running_tansu, with_topic_prefix

    kafka_node, worker = net.add("kafka"), net.add("worker")
    with (
        running_tansu(netns=kafka_node.netns, host=kafka_node.address) as server,
        probe(worker, "kafka", with_topic_prefix(server.url)) as client,
    ):
        client.send("enqueue")
        assert client.answer(60)["ok"]
        net.cut(worker, kafka_node)
        # librdkafka reports the record by message.timeout.ms (the delivery timeout) at the latest.
        client.send("enqueue")
        answer = client.answer(DELIVERY_TIMEOUT + 5 + MARGIN)
        assert not answer["ok"], answer
        print(f"an enqueue into the cut failed after {answer['seconds']:.1f} s: {answer['error']}")
        net.heal(worker, kafka_node)
        healed = time.monotonic()
        client.until_ok("enqueue", timeout=60)
        print(f"enqueues work again {time.monotonic() - healed:.1f} s after the heal")


def test_the_relays_kafka_publisher_across_a_silent_cut_charges_no_attempt_and_publishes_after_the_heal(
    net: Network,
) -> None:
    """The relay's Kafka publisher (confirm timeout 5 s) in a namespace, Tansu in another.

    A batch published into a silent cut is an outage: the rows stay pending, no attempt is
    counted. After the heal, the producer that lived through the cut is fenced by Tansu
    (``PRODUCER_FENCED``: librdkafka asks for a new epoch after its records timed out, and
    Tansu refuses the old one); that is the producer's state, not the records': the publisher
    replaces it and charges no row, and the next batches are confirmed. Without
    ``PRODUCER_FENCED`` among the producer failures, every row of the batch after the heal
    counted a failed attempt.
    """
    from ..kafka_server import running_tansu, with_topic_prefix

    kafka_node, relay = net.add("kafka"), net.add("relay")

    def publish() -> dict[str, Any]:
        client.send("publish 6")
        answer = client.answer(60 + MARGIN)
        print(f"{answer['detail']} after {answer['seconds']:.1f} s")
        assert not answer["detail"]["failed"], f"rows were charged a failed attempt: {answer['error']}"
        return answer

    with (
        running_tansu(netns=kafka_node.netns, host=kafka_node.address) as server,
        probe(relay, "relay", with_topic_prefix(server.url)) as client,
    ):
        assert publish()["ok"]
        net.cut(relay, kafka_node)
        # Every report arrives by message.timeout.ms (the confirm timeout) + the publisher's 5 s.
        assert not publish()["ok"]
        net.heal(relay, kafka_node)
        healed = time.monotonic()
        while not publish()["ok"]:
            assert time.monotonic() < healed + 90, "the relay still cannot publish after the heal"
            time.sleep(0.5)
        print(f"batches confirmed again {time.monotonic() - healed:.1f} s after the heal")


def test_a_kafka_consumer_gives_up_a_request_on_a_silent_cut_within_the_socket_timeout_and_rejoins_after_the_heal(
    net: Network,
) -> None:
    """A worker's Kafka consumer never raises on a cut: librdkafka fails a request in flight
    after ``socket.timeout.ms`` and opens its connection again. The test waits for that log
    line from the broker's connection (the group coordinator's heartbeat has the session as
    its timeout, and the test URL's session is 2 s); with librdkafka's own 60 s it came after
    the deadline. After the heal, the same consumer gets its partitions again.
    """
    from estafeta_brokers.kafka_config import COMMON_DEFAULTS

    from ..kafka_server import running_tansu, with_topic_prefix

    bound = int(COMMON_DEFAULTS["socket.timeout.ms"]) / 1000 + 1  # librdkafka scans for timeouts each second
    kafka_node, worker = net.add("kafka"), net.add("worker")
    with (
        running_tansu(netns=kafka_node.netns, host=kafka_node.address) as server,
        probe(worker, "kafka-verbose", with_topic_prefix(server.url)) as client,
    ):
        client.send("enqueue")
        assert client.answer(60)["ok"]
        client.send("consume 600")
        client.line_with(lambda line: "assigned partitions" in line, 60)
        time.sleep(1.0)  # fetching
        net.cut(worker, kafka_node)
        cut_at = time.monotonic()
        line = client.line_with(
            lambda line: "Request in flight (after" in line and "GroupCoordinator" not in line, bound + MARGIN
        )
        print(f"{time.monotonic() - cut_at:.1f} s after the cut: {line.strip()}")
        net.heal(worker, kafka_node)
        healed = time.monotonic()
        client.line_with(lambda line: "assigned partitions" in line, 60 + MARGIN)
        print(f"the consumer has its partitions again {time.monotonic() - healed:.1f} s after the heal")
