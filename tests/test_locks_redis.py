"""Redis leases: ownership, fencing tokens, Redlock quorums and unavailable servers.

The quorum tests run private ``redis-server`` processes (tests/redis_servers.py) and kill
them; the shared Redis is only used with this run's key namespace.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import dramatiq
import psycopg
import pytest
from dramatiq.brokers.stub import StubBroker

from estafeta import LockLost, LockServerUnavailable, RedisLock, Redlock, Runtime, deliver, redis_lock
from estafeta_sql import fences
from estafeta_sql.errors import LockNotAcquired
from tests.app import STEPS
from tests.app import app as tests_app

from .helpers import message_for, scalar, wait_until
from .lock_steps import Charge, charges, open_account
from .redis_servers import RedisServer, free_port, redis_servers
from .test_locks import holding, lock_runtime

CHARGE = STEPS["probe.test_charge"]


@pytest.fixture
def redlock(redis_url: str) -> Iterator[Redlock]:
    client = Redlock.from_url(redis_url)
    yield client
    client.close()


def key() -> str:
    return f"order:{uuid.uuid4()}"


def test_only_the_holder_can_release(redlock: Redlock) -> None:
    name = key()
    lock = redlock.acquire(name, ttl=30, wait=0)
    impostor = RedisLock(name, "not-the-holders-value", lock.token, lock.valid_until, redlock)
    assert impostor.release() is False
    assert redlock.try_acquire(name, ttl=30) is None
    assert lock.release() is True
    assert redlock.try_acquire(name, ttl=30) is not None


def test_an_expired_holder_can_neither_release_nor_extend_its_successors_lease(redlock: Redlock) -> None:
    name = key()
    first = redlock.acquire(name, ttl=0.1, wait=0)
    second = redlock.acquire(name, ttl=30, wait=2)  # waits for the first lease to expire
    assert second.token > first.token
    assert first.release() is False
    with pytest.raises(LockLost, match=name):
        first.extend(30)
    assert redlock.try_acquire(name, ttl=30) is None
    second.release()


def test_the_holder_extends_its_lease(redlock: Redlock) -> None:
    name = key()
    lock = redlock.acquire(name, ttl=0.3, wait=0)
    lock.extend(30)
    time.sleep(0.5)
    assert lock.remaining > 25
    assert redlock.try_acquire(name, ttl=30) is None
    assert lock.release() is True


def test_tokens_grow_with_every_acquisition(redlock: Redlock) -> None:
    name, tokens = key(), []
    for _ in range(5):
        lock = redlock.acquire(name, ttl=30, wait=0)
        tokens.append(lock.token)
        lock.release()
    assert tokens == sorted(set(tokens))


def test_redis_lock_is_a_library_context_manager(redis_url: str) -> None:
    name = key()
    with redis_lock(name, ttl=10, url=redis_url) as lock:
        assert lock.key == name and lock.token > 0 and 0 < lock.remaining <= 10
        with pytest.raises(LockNotAcquired, match=name), redis_lock(name, ttl=10, wait=0.05, url=redis_url):
            pass
    with redis_lock(name, ttl=10, wait=0, url=redis_url) as again:
        assert again.token > lock.token


def test_a_quorum_survives_a_minority_of_servers_down_and_tokens_keep_growing(tmp_path: Path) -> None:
    with redis_servers(3, tmp_path) as servers:
        client = Redlock([s.url for s in servers])
        name, tokens = key(), []
        try:
            # Each round a different server is down (and comes back empty when killed):
            # the quorums only overlap in one server, yet the tokens must grow.
            for down in [None, 0, 1, 2, None]:
                if down is not None:
                    servers[down].stop()
                lock = client.acquire(name, ttl=30, wait=0)
                tokens.append(lock.token)
                assert lock.release() is True
                if down is not None:
                    servers[down].start()
        finally:
            client.close()
        assert tokens == sorted(set(tokens)), tokens


def test_without_a_quorum_acquiring_fails_at_once_with_a_clear_error(tmp_path: Path) -> None:
    with redis_servers(3, tmp_path) as servers:
        servers[0].stop()
        servers[2].stop()
        client = Redlock([s.url.replace("//", "//:hunter2@") for s in servers])
        name = key()
        started = time.monotonic()
        try:
            with pytest.raises(LockServerUnavailable) as failure:
                client.acquire(name, ttl=30, wait=30)
        finally:
            client.close()
        assert time.monotonic() - started < 10  # it did not wait out the 30 s
        message = str(failure.value)
        assert "2 of 3 Redis lock servers unreachable" in message and str(servers[0].port) in message
        assert "hunter2" not in message
        # The one server that said yes was released, not left holding the key for 30 s.
        assert servers[1].client().keys("*lock*") == []


def test_a_failed_quorum_releases_what_it_took(tmp_path: Path) -> None:
    with redis_servers(3, tmp_path) as servers:
        name = key()
        for server in servers[1:]:  # another holder has the key on two servers out of three
            server.client().set(f"estafeta:lock:{name}", "someone-else", px=30_000)
        client = Redlock([s.url for s in servers])
        try:
            with pytest.raises(LockNotAcquired, match="held by another"):
                client.acquire(name, ttl=30, wait=0.2)
        finally:
            client.close()
        assert servers[0].client().get(f"estafeta:lock:{name}") is None


def test_a_closed_port_is_a_clear_error_not_a_hang() -> None:
    url = f"redis://:secret@127.0.0.1:{free_port()}/0"
    client = Redlock.from_url(url)
    try:
        with pytest.raises(LockServerUnavailable, match=r"1 of 1 Redis lock servers unreachable") as failure:
            client.acquire(key(), ttl=30, wait=30)
    finally:
        client.close()
    assert "secret" not in str(failure.value)


def test_redis_down_makes_the_step_fail_and_retry_until_it_is_back(
    runtime: Runtime, lock_tables: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    server = RedisServer(tmp_path)
    rt = lock_runtime(lock_tables, server.url, max_retries=100, min_backoff_ms=50, max_backoff_ms=100)
    broker = StubBroker()
    broker.emit_after("process_boot")
    tests_app.bind(broker, rt)
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=1)
    worker.start()
    order_id = uuid.uuid4()
    open_account(conn, order_id)
    try:
        # The step itself says why it failed...
        with pytest.raises(LockServerUnavailable, match=f"127.0.0.1:{server.port}"):
            deliver(CHARGE, rt, message_for(CHARGE.actor_name, Charge(order_id)))
        # ...and through a worker it is retried with backoff, not lost, until Redis is back.
        broker.enqueue(message_for(CHARGE.actor_name, Charge(order_id)))
        wait_until(
            lambda: (scalar(conn, "SELECT max(attempts) FROM probe.inbox_attempts") or 0) >= 3,
            what="retries while Redis is down",
        )
        assert charges(conn) == 0
        server.start()
        wait_until(lambda: charges(conn) == 1, what="the charge")
    finally:
        worker.stop()
        broker.close()
        rt.close()
        server.stop()


# Fencing in PostgreSQL.


def test_the_fence_refuses_a_token_that_is_not_newer(runtime: Runtime, conn: psycopg.Connection[Any]) -> None:
    assert fences.advance(conn, "pingpong", "order:f", 5) is None
    assert fences.advance(conn, "pingpong", "order:f", 5) == 5
    assert fences.advance(conn, "pingpong", "order:f", 3) == 5
    assert fences.advance(conn, "pingpong", "order:f", 6) is None
    assert fences.newest(conn, "pingpong", "order:f") == 6


def test_a_guarded_transaction_rolls_back_once_a_newer_token_was_recorded(
    runtime: Runtime, lock_tables: str, conn: psycopg.Connection[Any]
) -> None:
    fences.advance(conn, "pingpong", "order:g", 1)
    with psycopg.connect(lock_tables) as stale:
        stale.execute("INSERT INTO probe.test_accounts (order_id, balance_cents) VALUES (%s, 1)", (uuid.uuid4(),))
        fences.advance(conn, "pingpong", "order:g", 2)  # a successor, while the stale holder works
        with pytest.raises(fences.StaleFencingToken, match=r"token 1 is stale \(token 2 was recorded since"):
            fences.check(stale, "pingpong", "order:g", 1)
        stale.rollback()
    assert scalar(conn, "SELECT count(*) FROM probe.test_accounts") == 0


def test_a_successor_waits_for_a_checked_transaction_to_commit_before_it_reads(
    runtime: Runtime, lock_tables: str, conn: psycopg.Connection[Any]
) -> None:
    # The window between the check and the commit: the successor's advance must wait, or it
    # could read the balance before the checked transaction's change commits.
    fences.advance(conn, "pingpong", "order:w", 1)
    with psycopg.connect(lock_tables) as holder, psycopg.connect(lock_tables, autocommit=True) as successor:
        fences.check(holder, "pingpong", "order:w", 1)
        successor_pid = successor.info.backend_pid
        done: list[int | None] = []
        thread = threading.Thread(target=lambda: done.append(fences.advance(successor, "pingpong", "order:w", 2)))
        thread.start()
        wait_until(
            lambda: (
                scalar(conn, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", successor_pid) == "Lock"
            ),
            what="the successor to wait on the fence row",
        )
        assert done == []
        holder.commit()
        thread.join(10)
    assert done == [None]


def test_a_successor_stops_waiting_for_the_fence_after_the_lock_timeout(
    runtime: Runtime, lock_tables: str, conn: psycopg.Connection[Any]
) -> None:
    # A holder stopped between its check and its commit must not hang its successor.
    fences.advance(conn, "pingpong", "order:t", 1)
    with psycopg.connect(lock_tables) as holder, psycopg.connect(lock_tables, autocommit=True) as successor:
        fences.check(holder, "pingpong", "order:t", 1)
        with pytest.raises(psycopg.errors.LockNotAvailable):
            fences.advance(successor, "pingpong", "order:t", 2, lock_timeout_ms=100)
        # The settings were the statement's own: the session keeps its defaults.
        assert scalar(successor, "SHOW lock_timeout") == "0"
        assert scalar(successor, "SHOW synchronous_commit") == "on"
        holder.commit()
    assert fences.advance(conn, "pingpong", "order:t", 2) is None


def test_a_check_blocked_by_a_transaction_on_the_fence_row_gives_up_after_the_lock_timeout(
    runtime: Runtime, lock_tables: str, conn: psycopg.Connection[Any]
) -> None:
    # An operator's prune left open (or anything else holding the row) must not hang a step.
    fences.advance(conn, "pingpong", "order:q", 1)
    with psycopg.connect(lock_tables) as operator, psycopg.connect(lock_tables) as step:
        assert fences.prune(operator, "pingpong", timedelta(0)) == 1  # not committed yet
        with pytest.raises(psycopg.errors.LockNotAvailable):
            fences.check(step, "pingpong", "order:q", 1, lock_timeout_ms=100)
        operator.rollback()


def test_tokens_lost_by_redis_heal_through_the_fence(
    runtime: Runtime, lock_tables: str, redis_url: str, conn: psycopg.Connection[Any]
) -> None:
    # A server restarted empty hands out small tokens again; the fence has seen bigger ones.
    name = key()
    fences.advance(conn, "pingpong", name, 1000)
    rt = lock_runtime(lock_tables, redis_url)
    try:
        with holding(rt, lock_tables, name):
            pass
        assert fences.newest(conn, "pingpong", name) > 1000
    finally:
        rt.close()
