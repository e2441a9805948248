"""Locks across real worker processes on RabbitMQ and Redis, and a holder stopped with SIGSTOP.

Workers are ``dramatiq tests.worker`` processes running the charge-like
step of tests/lock_steps.py; messages are enqueued straight to the broker.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from estafeta import Runtime, deliver
from estafeta_brokers import broker_from_url
from tests.app import STEPS

from ..helpers import message_for, scalar, wait_until
from ..lock_steps import Charge, charges, open_account
from ..services import BROKER_URL_FIXTURES
from ..test_locks import lock_runtime
from . import processes

pytestmark = pytest.mark.integration

CHARGE = STEPS["probe.test_charge"]
#: The lease of the SIGSTOP tests: short, so that the stopped holder outlives it quickly.
LEASE_MS = 1000


# The relay and the workers on each broker; the Redis and Kafka runs are long: make test-heavy.
@pytest.fixture(
    params=["rabbitmq", pytest.param("redis", marks=pytest.mark.heavy), pytest.param("kafka", marks=pytest.mark.heavy)]
)
def broker_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(BROKER_URL_FIXTURES[request.param]))


def enqueue(broker_url: str, messages: list[Any]) -> None:
    broker = broker_from_url(broker_url)
    try:
        broker.declare_queue("probe")
        for message in messages:
            broker.enqueue(message)
    finally:
        broker.close()


def wait_ready(worker: processes.Process, count: int) -> None:
    wait_until(
        lambda: worker.output().count("Worker process is ready for action.") >= count,
        timeout=60,
        what=f"{count} worker processes to start",
    )


def charge_from_two_processes(
    env: dict[str, str], broker_url: str, actor_name: str, order_id: uuid.UUID, conn: Any, tmp_path: Path
) -> None:
    """16 charges of one order, delivered to 8 threads in 2 worker processes at once."""
    module = "tests.worker"
    with processes.running(processes.workers(env, tmp_path, processes=2, threads=4, module=module)) as (worker,):
        wait_ready(worker, 2)
        messages = [message_for(actor_name, Charge(order_id, think_ms=50)) for _ in range(16)]
        enqueue(broker_url, messages)
        wait_until(
            lambda: scalar(conn, "SELECT count(*) FROM probe.test_charges") == 16,
            timeout=90,
            what="all 16 deliveries to commit",
        )


def test_eight_threads_in_two_processes_charge_an_order_once(
    broker_url: str, lock_url: str, lock_tables: str, runtime: Runtime, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    order_id = uuid.uuid4()
    open_account(conn, order_id, 1000)
    env = processes.service_env(lock_tables, broker_url, ESTAFETA_LOCK_URL=lock_url)
    charge_from_two_processes(env, broker_url, "probe.test_charge", order_id, conn, tmp_path)
    assert charges(conn) == 1
    assert scalar(conn, "SELECT balance_cents FROM probe.test_accounts") == 900
    # Both processes took part: the serialisation held across processes, not only threads.
    assert scalar(conn, "SELECT count(DISTINCT worker_pid) FROM probe.test_charges") == 2


@pytest.mark.heavy
def test_without_the_lock_eight_threads_in_two_processes_charge_an_order_several_times(
    amqp_url: str, lock_tables: str, runtime: Runtime, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    # The control: the same workers and messages, the step without its lock.
    order_id = uuid.uuid4()
    open_account(conn, order_id, 1000)
    env = processes.service_env(lock_tables, amqp_url)
    charge_from_two_processes(env, amqp_url, "probe.test_charge_unlocked", order_id, conn, tmp_path)
    assert charges(conn) > 1


def stop_a_holder_past_its_lease(
    module: str, broker_url: str, redis_url: str, lock_tables: str, conn: Any, tmp_path: Path
) -> str:
    """A worker reads the balance and is stopped; a successor charges; the worker resumes.

    Returns the worker's output, once the stopped holder's message has committed.
    """
    order_id = uuid.uuid4()
    open_account(conn, order_id, 1000)
    env = processes.service_env(
        lock_tables, broker_url, ESTAFETA_LOCK_URL=redis_url, ESTAFETA_LOCK_TTL_MS=str(LEASE_MS)
    )
    marker = tmp_path / "balance-read"
    first = message_for(CHARGE.actor_name, Charge(order_id, think_ms=LEASE_MS, marker=str(marker)))
    successor = lock_runtime(lock_tables, redis_url, lock_ttl_ms=LEASE_MS)
    with processes.running(processes.workers(env, tmp_path, processes=1, threads=1, module=module)) as (worker,):
        wait_ready(worker, 1)
        enqueue(broker_url, [first])
        wait_until(marker.exists, what="the worker to read the balance under its lock")
        worker.kill(signal.SIGSTOP)
        try:
            time.sleep(LEASE_MS / 1000 * 1.5)  # the stopped holder's lease runs out
            second = message_for(CHARGE.actor_name, Charge(order_id))
            assert deliver(CHARGE, successor, second) == "ok"
            assert charges(conn) == 1
        finally:
            worker.kill(signal.SIGCONT)
            successor.close()
        wait_until(
            lambda: scalar(conn, "SELECT count(*) FROM probe.inbox WHERE message_id = %s", first.message_id) == 1,
            what="the stopped holder's message to be done",
        )
        return worker.output()


def test_a_holder_stopped_past_its_lease_is_fenced_off_and_rolled_back(
    broker_url: str, redis_url: str, lock_tables: str, runtime: Runtime, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    output = stop_a_holder_past_its_lease("tests.worker", broker_url, redis_url, lock_tables, conn, tmp_path)
    assert charges(conn) == 1
    assert scalar(conn, "SELECT balance_cents FROM probe.test_accounts") == 900
    # Its write was refused and rolled back; its retry (a new lease, a newer token) found
    # the order charged and changed nothing.
    assert "StaleFencingToken" in output
    tokens = [row[0] for row in conn.execute("SELECT fencing_token FROM probe.test_charges ORDER BY id")]
    assert len(tokens) == 2 and tokens[0] < tokens[1]


@pytest.mark.heavy
def test_without_fencing_a_holder_stopped_past_its_lease_charges_again(
    redis_url: str, lock_tables: str, runtime: Runtime, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    # The control: the same scenario with a lease and no fence double-charges.
    output = stop_a_holder_past_its_lease(
        "tests.integration.worker_unfenced", redis_url, redis_url, lock_tables, conn, tmp_path
    )
    assert charges(conn) == 2
    assert scalar(conn, "SELECT balance_cents FROM probe.test_accounts") == 900  # a lost update, too
    assert "StaleFencingToken" not in output
