"""The relay killed, stopped and cut off at the worst moments, with real processes and brokers.

Every fault is real: relays die by SIGKILL at a state the test has waited for, a broker
node is stopped with ``rabbitmqctl stop_app`` (a private node, never the shared one),
the listener's PostgreSQL backend is terminated. Nothing is lost; copies published
twice are absorbed by the consumers' inbox.
"""

from __future__ import annotations

import random
import signal
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest

from estafeta_actors.pingpong import Ping

from ..helpers import now, scalar, wait_until
from ..relay_support import add, arrivals, check_order
from ..services import BROKER_URL_FIXTURES
from . import processes
from .relay_faults import blackhole, free_port, read_queue, relay_waits_to_delete, unlocked_rows, with_port

pytestmark = pytest.mark.integration


# The relay and the workers on each broker; the Redis and Kafka runs are long: make test-heavy.
@pytest.fixture(
    params=["rabbitmq", pytest.param("redis", marks=pytest.mark.heavy), pytest.param("kafka", marks=pytest.mark.heavy)]
)
def broker_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(BROKER_URL_FIXTURES[request.param]))


def pings(conn: psycopg.Connection[object], count: int) -> None:
    from estafeta_actors.pingpong import SERVICE as pingpong_service

    with conn.transaction():
        for _ in range(count):
            pingpong_service.send(conn, Ping(uuid.uuid4(), now()))


def all_ponged_once(conn: psycopg.Connection[object], count: int) -> bool:
    return scalar(conn, "SELECT count(*) FROM pingpong.pings WHERE pongs = 1") == count


def test_relay_killed_after_the_confirm_before_the_delete(broker_url, database_url, runtime, conn, tmp_path: Path):
    env = processes.service_env(database_url, broker_url)
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
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 20  # confirmed, yet not deleted
    workers = processes.workers(env, tmp_path)
    with processes.running(workers, processes.relay(env, tmp_path)):
        wait_until(lambda: all_ponged_once(conn, 20), timeout=60, what="every ping answered")
        # Each ping came twice and took effect once.
        wait_until(lambda: workers.output().count("duplicate delivery of") == 20, timeout=30, what="the copies")
    assert scalar(conn, "SELECT max(pongs) FROM pingpong.pings") == 1


@pytest.mark.heavy
def test_relay_killed_after_claiming_before_publishing(broker_url, database_url, runtime, conn, tmp_path: Path):
    pings(conn, 20)
    with blackhole() as port:
        # A "broker" that accepts the connection and never answers: the relay claims its
        # batch, then waits on the broker.
        env = processes.service_env(database_url, with_port(broker_url, port))
        first = processes.relay(env, tmp_path)
        with processes.running(first):
            wait_until(lambda: unlocked_rows(conn) == 0, timeout=30, what="the relay holding its claim")
            first.kill(signal.SIGKILL)
            first.popen.wait(10)
    env = processes.service_env(database_url, broker_url)
    workers = processes.workers(env, tmp_path)
    with processes.running(workers, processes.relay(env, tmp_path)):
        wait_until(lambda: all_ponged_once(conn, 20), timeout=60, what="every ping answered")
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0, timeout=30)
        assert "duplicate delivery" not in workers.output()  # nothing had left before the kill
    assert scalar(conn, "SELECT max(pongs) FROM pingpong.pings") == 1


@pytest.mark.heavy
def test_listener_backend_terminated(database_url, amqp_url, runtime, conn, tmp_path: Path) -> None:
    # A 2 s poll: the rows must go out within it, whether or not the listener is back.
    env = {**processes.service_env(database_url, amqp_url), "ESTAFETA_RELAY_POLL_INTERVAL": "2"}
    queue = f"relaycheck_{uuid.uuid4().hex[:8]}"

    def listener_pids() -> set[int]:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'estafeta-relay-listener'"
        ).fetchall()
        return {int(r[0]) for r in rows}

    def outbox_empty() -> bool:
        return scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0

    with processes.running(processes.relay(env, tmp_path, "--lanes", "2")):
        wait_until(lambda: len(listener_pids()) == 2, timeout=30, what="the listeners (one per lane)")
        old = listener_pids()
        # Only the relay's own listeners: found by their application_name in this run's database.
        for pid in old:
            assert scalar(conn, "SELECT pg_terminate_backend(%s)", pid)
        for seq in range(5):
            add(conn, "k", seq, queue=queue)
        wait_until(outbox_empty, timeout=2 + 8, what="the rows, within a poll interval (and slack)")
        wait_until(lambda: len(listener_pids() - old) == 2, timeout=10, what="the listeners reconnected")
        add(conn, "k", 5, queue=queue)
        wait_until(outbox_empty, timeout=2 + 8)
    received = arrivals(read_queue(amqp_url, queue))
    assert check_order(received, {"k": list(range(6))}) == 0


@pytest.mark.heavy
def test_three_relays_killed_at_random_keep_every_key_in_order(broker_url, database_url, runtime, conn, tmp_path):
    env = processes.service_env(database_url, broker_url, ESTAFETA_RELAY_BATCH_SIZE="10")
    queue = f"relaycheck_{uuid.uuid4().hex[:8]}"
    keys = [f"k{i}" for i in range(40)]
    expected: dict[str | None, list[int]] = {key: [] for key in keys}
    relays = [processes.relay(env, tmp_path) for _ in range(3)]
    stop = threading.Event()
    kills = {"all": 0, "inside a batch": 0}

    def write() -> None:
        with psycopg.connect(database_url, autocommit=True) as writer:
            # At least 25 bursts, and more (up to 200) until three kills landed inside a batch:
            # on a loaded machine a relay takes seconds to start, and a kill between batches
            # tests nothing.
            seq = 0
            while seq < 25 or (kills["inside a batch"] < 3 and seq < 200):
                seq += 1
                with writer.transaction():  # bursts: a backlog for the relays to be busy with
                    for key in random.sample(keys, k=30):
                        add(writer, key, seq, queue=queue)
                        expected[key].append(seq)
                time.sleep(0.25)

    def kill_inside_a_batch(watcher: psycopg.Connection[object]) -> bool:
        """SIGKILL every relay if one is inside a batch right now; otherwise let them go on."""
        # Frozen first: a relay whose batch transaction is open (idle in it: publishing,
        # or between claim and delete) cannot commit while stopped, so what the check
        # sees is the state the kill lands in.
        for relay in relays:
            relay.kill(signal.SIGSTOP)
        if not relay_in_batch(watcher):
            for relay in relays:
                relay.kill(signal.SIGCONT)
            return False
        for i, relay in enumerate(relays):
            relay.kill(signal.SIGKILL)
            relay.stop()
            relays[i] = processes.relay(env, tmp_path)
        return True

    def kill_at_random() -> None:
        with psycopg.connect(database_url, autocommit=True) as watcher:
            while not stop.wait(random.uniform(0.3, 0.8)):
                deadline = time.monotonic() + 3
                while not (landed := kill_inside_a_batch(watcher)) and time.monotonic() < deadline:
                    time.sleep(random.uniform(0.001, 0.02))
                kills["all"] += 1
                kills["inside a batch"] += landed

    killer = threading.Thread(target=kill_at_random)
    try:
        killer.start()
        write()
    finally:
        stop.set()
        killer.join()
    with processes.running(*relays):
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0, timeout=60)
    duplicates = check_order(arrivals(read_queue(broker_url, queue)), expected)
    assert kills["inside a batch"] >= 3, kills  # the kills that test something: with a batch in hand
    print(f"relays killed {kills}; {duplicates} rows published twice")


def relay_in_batch(conn: psycopg.Connection[object]) -> bool:
    """Whether a relay of this database holds a batch now: rows claimed, publishing or deleting them.

    Idle in its transaction (between statements: it waits on the broker, or is about to
    delete), with a transaction id: claiming rows FOR UPDATE is what gives it one.
    """
    return bool(
        scalar(
            conn,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'estafeta-relay' AND state = 'idle in transaction'"
            " AND backend_xid IS NOT NULL",
        )
    )


@pytest.mark.heavy
def test_sigterm_finishes_the_batch_in_hand_and_loses_nothing(broker_url, database_url, runtime, conn, tmp_path):
    env = processes.service_env(database_url, broker_url, ESTAFETA_RELAY_BATCH_SIZE="50")
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
    assert check_order(arrivals(read_queue(broker_url, queue)), expected) == 0


def test_relay_serves_metrics_and_logs_batches_without_payloads(database_url, redis_url, runtime, conn, tmp_path):
    env = processes.service_env(database_url, redis_url)
    port = free_port()
    argv = [str(processes.BIN / "estafeta"), "-vv", "relay", "--metrics-port", str(port), "--metrics-host", "127.0.0.1"]
    relay = processes.Process("relay", argv, env, tmp_path)
    queue = f"relaycheck_{uuid.uuid4().hex[:8]}"
    with processes.running(relay):
        with conn.transaction():
            for seq in range(3):
                add(conn, "secret-key-hunter2", seq, queue=queue)
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0, timeout=30)
        wait_until(lambda: "published 3" in relay.output(), timeout=10, what="the batch's debug line")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
        output = relay.output()
    assert 'estafeta_outbox_pending_count{service="pingpong"} 0.0' in text
    assert 'estafeta_outbox_published_total{service="pingpong"} 3.0' in text
    assert "hunter2" not in output  # one line per batch, counts only: never a payload or key
    read_queue(redis_url, queue)
