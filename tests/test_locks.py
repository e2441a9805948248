"""The lock contract, run against every backend (PostgreSQL advisory locks, Redis leases).

Real PostgreSQL and Redis; steps run through :func:`estafeta_actors.step.deliver` in threads, or
through a StubBroker worker where retries matter.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import dramatiq
import psycopg
import pytest
from dramatiq.brokers.stub import StubBroker

from estafeta import Runtime, Settings, StepSpec, deliver
from estafeta_sql.errors import LockNotAcquired

from .app import STEPS
from .app import app as tests_app
from .conftest import TEST_SETTINGS
from .helpers import message_for, scalar, wait_until
from .integration.processes import ROOT
from .lock_steps import Charge, charges, open_account
from .steps import PEEKED, Peek

CHARGE = STEPS["probe.test_charge"]
CHARGE_UNLOCKED = STEPS["probe.test_charge_unlocked"]
PEEK = STEPS["probe.test_peek"]


def lock_runtime(database_url: str, lock_url: str, **overrides: Any) -> Runtime:
    """A runtime on the run's database whose steps lock through ``lock_url``."""
    settings = {**TEST_SETTINGS, "lock_timeout_ms": 3000, **overrides}
    return Runtime(Settings(database_url=database_url, lock_url=lock_url, **settings))  # type: ignore[arg-type]


@contextlib.contextmanager
def holding(rt: Runtime, dsn: str, key: str) -> Iterator[psycopg.Connection[Any]]:
    """A transaction on the pingpong database holding ``key`` (as a step would)."""
    with rt.database("pingpong").transaction() as conn, rt.locks.hold(conn, key, schema="pingpong", dsn=dsn) as held:
        yield conn
        held.before_commit(conn)


@pytest.fixture
def locked(runtime: Runtime, lock_tables: str, lock_url: str) -> Iterator[Runtime]:
    """A runtime per lock backend (``runtime`` empties the tables first)."""
    rt = lock_runtime(lock_tables, lock_url)
    yield rt
    rt.close()


def charge_concurrently(
    runtime: Runtime, spec: StepSpec, order_id: uuid.UUID, threads: int = 8, think_ms: int = 30
) -> list[str]:
    """``threads`` different messages charging ``order_id``, delivered at the same instant."""
    barrier = threading.Barrier(threads)
    outcomes: list[str] = []

    def run() -> None:
        message = message_for(spec.actor_name, Charge(order_id, think_ms=think_ms))
        barrier.wait()
        outcomes.append(deliver(spec, runtime, message))

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    return outcomes


def test_concurrent_deliveries_for_one_order_charge_it_once(locked: Runtime, conn: psycopg.Connection[Any]) -> None:
    order_id = uuid.uuid4()
    open_account(conn, order_id, 1000)
    outcomes = charge_concurrently(locked, CHARGE, order_id)
    assert outcomes == ["ok"] * 8
    assert charges(conn) == 1
    assert scalar(conn, "SELECT balance_cents FROM probe.test_accounts") == 900
    assert scalar(conn, "SELECT count(*) FROM probe.inbox") == 8


def test_without_the_lock_the_same_deliveries_charge_several_times(
    runtime: Runtime, lock_tables: str, conn: psycopg.Connection[Any]
) -> None:
    # The control of the test above: the scenario really races, so "once" is the lock's doing.
    order_id = uuid.uuid4()
    open_account(conn, order_id, 1000)
    # A wide window between the check and the charge: on a loaded machine the threads reach it
    # spread out, and 30 ms could let them pass one after another (seen: 1 charge).
    charge_concurrently(runtime, CHARGE_UNLOCKED, order_id, think_ms=500)
    assert charges(conn) > 1


def test_different_keys_do_not_wait_for_each_other(runtime: Runtime, lock_tables: str, lock_url: str) -> None:
    rt = lock_runtime(lock_tables, lock_url, lock_timeout_ms=200)
    try:
        with holding(rt, lock_tables, "order:a"), holding(rt, lock_tables, "order:b"):
            pass
    finally:
        rt.close()


def test_waiting_for_a_held_lock_is_bounded(runtime: Runtime, lock_tables: str, lock_url: str) -> None:
    rt = lock_runtime(lock_tables, lock_url, lock_timeout_ms=200)
    try:
        with (
            holding(rt, lock_tables, "order:busy"),
            pytest.raises(LockNotAcquired, match=r"order:busy|lock not acquired"),
            holding(rt, lock_tables, "order:busy"),
        ):
            pass
    finally:
        rt.close()


@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_lock_is_free_once_the_transaction_ended(
    runtime: Runtime, lock_tables: str, lock_url: str, ending: str
) -> None:
    # A long lease and a short wait: only the release at the end of the transaction frees it in time.
    rt = lock_runtime(lock_tables, lock_url, lock_timeout_ms=300, lock_ttl_ms=60_000)
    try:
        with contextlib.suppress(RuntimeError), holding(rt, lock_tables, "order:x"):
            if ending == "rollback":
                raise RuntimeError("the step failed")
        with holding(rt, lock_tables, "order:x"):
            pass
    finally:
        rt.close()


def test_a_step_whose_lock_is_busy_is_retried_and_then_succeeds(
    runtime: Runtime, lock_tables: str, lock_url: str, conn: psycopg.Connection[Any]
) -> None:
    rt = lock_runtime(lock_tables, lock_url, lock_timeout_ms=100, max_retries=100, min_backoff_ms=20)
    broker = StubBroker()
    broker.emit_after("process_boot")
    tests_app.bind(broker, rt)
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=2)
    worker.start()
    order_id = uuid.uuid4()
    open_account(conn, order_id)
    try:
        with holding(rt, lock_tables, f"order:{order_id}"):
            broker.enqueue(message_for(CHARGE.actor_name, Charge(order_id)))
            # Each delivery is counted before it starts: a second one means a retry.
            wait_until(
                lambda: (scalar(conn, "SELECT max(attempts) FROM probe.inbox_attempts") or 0) >= 2,
                what="the charge to fail on the busy lock and be retried",
            )
            assert charges(conn) == 0
        wait_until(lambda: charges(conn) == 1, what="the charge")
        assert scalar(conn, "SELECT count(*) FROM probe.dead_letters") == 0
    finally:
        worker.stop()
        broker.close()
        rt.close()


def test_a_holder_killed_with_sigkill_does_not_keep_the_lock(runtime: Runtime, lock_tables: str, lock_url: str) -> None:
    # PostgreSQL frees it at once (its backend sees the socket close), Redis once the lease ends:
    # the wait below is longer than the lease, shorter than forever.
    ttl_ms = 1000
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.lock_holder", lock_tables, lock_url, "order:killed", str(ttl_ms)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
    finally:
        holder.kill()
        holder.wait(10)
    rt = lock_runtime(lock_tables, lock_url, lock_timeout_ms=ttl_ms * 5, lock_ttl_ms=ttl_ms)
    try:
        with holding(rt, lock_tables, "order:killed"):
            pass
    finally:
        rt.close()


def test_pg_terminate_backend_on_a_holder_frees_the_lock_at_once(
    runtime: Runtime, lock_tables: str, conn: psycopg.Connection[Any]
) -> None:
    rt = lock_runtime(lock_tables, "postgres", lock_timeout_ms=60_000)
    acquired: list[bool] = []

    def wait_for_the_lock() -> None:
        with holding(rt, lock_tables, "order:terminated"):
            acquired.append(True)

    try:
        with (
            psycopg.connect(lock_tables) as holder,  # a connection of this test's own
            rt.locks.hold(holder, "order:terminated", schema="pingpong", dsn=lock_tables),
        ):
            waiter = threading.Thread(target=wait_for_the_lock)
            waiter.start()
            wait_until(lambda: _advisory_waiters(conn) == 1, what="the second step to wait for the lock")
            conn.execute("SELECT pg_terminate_backend(%s)", (holder.info.backend_pid,))
            # Well inside the waiter's 60 s lock_timeout: the lock died with the backend.
            waiter.join(10)
            assert acquired == [True]
            with pytest.raises(psycopg.OperationalError):
                holder.execute("SELECT 1")
    finally:
        rt.close()


def _advisory_waiters(conn: psycopg.Connection[Any]) -> int:
    # This run's database only: other suites share the server.
    return int(
        scalar(
            conn,
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
    )


def test_a_step_s_opening_statement_runs_in_its_transaction_unless_its_lock_is_taken_after_it(
    locked: Runtime, lock_url: str
) -> None:
    """``opening``: with the PostgreSQL lock (taken in the same round trip) its rows reach the
    function from the step's own transaction; a Redis lock is taken after that round trip,
    so the statement is not run before it and the function reads for itself."""
    ping_id = uuid.uuid4()
    message = message_for(PEEK.actor_name, Peek(ping_id))
    assert deliver(PEEK, locked, message) == "ok"
    found = PEEKED[ping_id]
    if lock_url == "postgres":
        assert found["opening"] == [{"ping_id": ping_id, "started": found["started"]}]
    else:
        assert found["opening"] is None
    # A duplicate is absorbed before the function: nothing more is recorded.
    PEEKED.clear()
    assert deliver(PEEK, locked, message) == "duplicate"
    assert PEEKED == {}
