"""The relay on real PostgreSQL and the StubBroker: what is claimed, in what order, what waits."""

from __future__ import annotations

import contextlib
import random
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from estafeta import Runtime
from estafeta_brokers.relay import Relay
from estafeta_sql import outbox as store
from estafeta_sql import outbox_admin

from .conftest import make_relay
from .helpers import scalar, wait_until
from .relay_support import QUEUE, SCHEMA, add, arrivals, check_order, drain_stub


@pytest.fixture
def queue(stub_broker: Any) -> str:
    stub_broker.declare_queue(QUEUE)
    return QUEUE


@contextlib.contextmanager
def claimed(dsn: str, limit: int = 100) -> Iterator[list[store.OutboxRow]]:
    """A relay's claim, its transaction open (its row locks held) until the block ends."""
    with psycopg.connect(dsn) as conn:
        try:
            yield store.claim_batch(conn, SCHEMA, limit)
        finally:
            conn.rollback()


def keys_and_seqs(rows: list[store.OutboxRow]) -> list[tuple[str | None, int]]:
    return [(r.ordering_key, r.message["args"][0]["seq"]) for r in rows]


def test_rows_reach_the_broker_in_commit_order_per_key(conn, relay: Relay, stub_broker, queue) -> None:
    expected: dict[str | None, list[int]] = {"a": [], "b": [], None: []}
    for seq in range(30):
        key = random.choice(["a", "b", None])
        add(conn, key, seq)
        expected[key].append(seq)
    assert relay.drain_once() == 30
    assert check_order(arrivals(drain_stub(stub_broker)), expected) == 0
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0


def test_a_relay_holding_a_key_keeps_every_other_relay_off_it(conn, database_url: str) -> None:
    for seq in range(3):
        add(conn, "a", seq)
        add(conn, "b", seq)
    with claimed(database_url, limit=4) as first, claimed(database_url) as second:
        # The first relay got both heads and the oldest followers; the second gets
        # nothing: both keys' heads are locked, and their later rows are not heads.
        assert keys_and_seqs(first) == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
        assert second == []
        add(conn, "c", 0)
        with claimed(database_url) as third:
            assert keys_and_seqs(third) == [("c", 0)]


def test_a_follower_behind_a_row_someone_else_locked_is_held_back(conn, database_url: str) -> None:
    ids = [add(conn, "a", seq) for seq in range(3)]
    with psycopg.connect(database_url) as other:
        other.execute("SELECT 1 FROM pingpong.outbox WHERE message_id = %s FOR UPDATE", (ids[1],))
        with claimed(database_url) as rows:
            # Row 2 is after the locked row 1: publishing it now would overtake it.
            assert keys_and_seqs(rows) == [("a", 0)]
        other.rollback()


def test_a_failing_head_holds_back_only_its_key(conn, runtime: Runtime, stub_broker, queue) -> None:
    relay = make_relay(runtime, stub_broker, max_attempts=2)
    add(conn, "stuck", 0, queue="nowhere")  # the stub broker has no such queue: refused
    add(conn, "stuck", 1)
    add(conn, "fine", 0)
    add(conn, "stuck", 2)
    add(conn, "fine", 1)
    add(conn, None, 0)
    assert relay.drain_once() == 3
    assert check_order(arrivals(drain_stub(stub_broker)), {"fine": [0, 1], None: [0]}) == 0
    row = conn.execute("SELECT attempts, status, last_error FROM pingpong.outbox ORDER BY id LIMIT 1").fetchone()
    assert row[0] == 1 and row[1] == "pending" and "QueueNotFound" in row[2]
    # Its second refusal (no backoff in the tests) is its last: it is failed now, and its
    # key's later rows are not even claimed.
    assert relay.drain_once() == 0
    stats = outbox_admin.stats(conn, SCHEMA)
    assert (stats.pending, stats.failed, stats.blocked_keys) == (2, 1, 1)
    assert "QueueNotFound" in (stats.oldest_error or "")
    add(conn, "fine", 2)
    assert relay.drain_once() == 1
    stub_broker.declare_queue("nowhere")
    (failed_id,) = outbox_admin.retry_failed(conn, SCHEMA)
    assert relay.drain_once() == 3
    assert [m.message_id for m in drain_stub(stub_broker, "nowhere")]
    assert check_order(arrivals(drain_stub(stub_broker)), {"fine": [2], "stuck": [1, 2]}) == 0
    assert failed_id > 0


def test_a_row_deferred_through_an_outage_is_parked_after_its_refusals_only(conn) -> None:
    # A broker that turned the row away for now (a RabbitMQ nack) defers it: its backoff
    # grows, but after a long outage its first refusal must not park it at once.
    add(conn, "a", 0)
    (row_id,) = [r[0] for r in conn.execute("SELECT id FROM pingpong.outbox").fetchall()]

    def fail(error: str, max_attempts: int | None) -> tuple[str, int, int]:
        store.record_publish_failure(conn, SCHEMA, [row_id], error, max_attempts=max_attempts, backoff=timedelta(0))
        return conn.execute("SELECT status, attempts, deferrals FROM pingpong.outbox").fetchone()

    for _ in range(5):
        fail("nacked", None)
    assert fail("refused", 2) == ("pending", 6, 5)
    assert fail("refused", 2) == ("failed", 7, 5)
    assert outbox_admin.retry_failed(conn, SCHEMA) == [row_id]
    assert conn.execute("SELECT status, attempts, deferrals FROM pingpong.outbox").fetchone() == ("pending", 0, 0)


def test_a_delayed_row_waits_in_the_outbox_without_holding_back_its_key(conn, relay: Relay, stub_broker, queue):
    add(conn, "a", 0, delay=timedelta(hours=1))
    add(conn, "a", 1)
    assert relay.drain_once() == 1
    assert check_order(arrivals(drain_stub(stub_broker)), {"a": [1]}) == 0
    stats = outbox_admin.stats(conn, SCHEMA)
    assert (stats.pending, stats.delayed, stats.oldest_pending_age_seconds) == (1, 1, 0.0)
    conn.execute("UPDATE pingpong.outbox SET available_at = now()")
    assert relay.drain_once() == 1
    assert check_order(arrivals(drain_stub(stub_broker)), {"a": [0]}) == 0


@contextlib.contextmanager
def running(relay: Relay) -> Iterator[None]:
    """``relay`` running in a thread, past the drain its listener asked for on connecting."""
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: relay.listening, what="the listener")
        # Past the drain the listener asked for when it started listening (wake read first:
        # cleared after the listener set it means that drain began; idle: it is over).
        wait_until(lambda: not relay.wake.is_set() and relay.idle.is_set(), what="the relay waiting for a wake-up")
        yield
    finally:
        stop.set()
        thread.join(10)


def test_the_relay_wakes_when_a_delayed_row_falls_due(conn, runtime, stub_broker, queue) -> None:
    relay = make_relay(runtime, stub_broker, poll_interval=60.0)
    with running(relay):
        add(conn, "a", 0, delay=timedelta(seconds=0.3))
        # Far sooner than the 60 s poll: the relay sleeps until the row is due, not a poll.
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0, timeout=20)
    assert check_order(arrivals(drain_stub(stub_broker)), {"a": [0]}) == 0


def recording_batches(relay: Relay) -> list[str]:
    """The schemas ``relay`` claims a batch from from now on, in order (it has several outboxes)."""
    assert len(relay.outboxes) > 1
    drained: list[str] = []
    batch = relay.relay_batch

    def recording(outbox: Any) -> Any:
        drained.append(outbox.schema)
        return batch(outbox)

    relay.relay_batch = recording  # type: ignore[method-assign]
    return drained


def test_a_notify_drains_only_the_outbox_it_names(conn, runtime, stub_broker, queue) -> None:
    relay = make_relay(runtime, stub_broker, poll_interval=60.0)
    drained = recording_batches(relay)
    with running(relay):
        drained.clear()
        add(conn, "k", 0)
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0, timeout=10)
        wait_until(lambda: relay.idle.is_set(), what="the relay idle again")
    # Every other outbox used to get a batch (a claim transaction) for each NOTIFY too.
    assert set(drained) == {SCHEMA}


def test_a_poll_claims_only_from_the_outboxes_with_a_row_due(conn, runtime, stub_broker, queue) -> None:
    relay = make_relay(runtime, stub_broker, poll_interval=0.05)
    drained = recording_batches(relay)
    with running(relay):
        drained.clear()
        # Written without a NOTIFY: only a poll finds it.
        conn.execute(
            "INSERT INTO pingpong.outbox (message_id, queue_name, actor_name, message)"
            " VALUES (gen_random_uuid(), %s, %s, %s)",
            (QUEUE, f"{QUEUE}.record", Jsonb({"args": [{"key": None, "seq": 0}], "kwargs": {}, "options": {}})),
        )
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0, timeout=10)
        time.sleep(0.5)  # ten more polls, every outbox empty
    # A poll used to claim from every outbox, a transaction each, whatever they held.
    assert drained == [SCHEMA]
    assert check_order(arrivals(drain_stub(stub_broker)), {None: [0]}) == 0


def test_the_poll_s_probe_tells_due_rows_from_later_ones(conn, runtime) -> None:
    later, due = timedelta(hours=1), timedelta(0)
    add(conn, "a", 0, delay=later)
    found = store.due_now(conn, [SCHEMA, "orders"])
    assert found["orders"] == store.Due(now=False, next_in=None)
    assert not found[SCHEMA].now and found[SCHEMA].next_in == pytest.approx(3600, abs=60)
    add(conn, "b", 0, delay=due)
    assert store.due_now(conn, [SCHEMA])[SCHEMA] == store.Due(now=True, next_in=None)
    conn.execute("UPDATE pingpong.outbox SET status = 'failed' WHERE available_at <= now()")
    assert store.due_now(conn, [SCHEMA])[SCHEMA].now is False, "a parked row waits for an operator, not a poll"


def test_a_delayed_row_falls_due_though_another_outbox_woke_the_relay_since(conn, runtime, stub_broker, queue):
    relay = make_relay(runtime, stub_broker, poll_interval=60.0)
    with running(relay):
        add(conn, "a", 0, delay=timedelta(seconds=1))
        wait_until(lambda: relay.idle.is_set() and not relay.wake.is_set(), what="the relay idle")
        with conn.transaction():
            conn.execute(
                "INSERT INTO orders.outbox (message_id, queue_name, actor_name, message)"
                " VALUES (gen_random_uuid(), %s, %s, %s)",
                (QUEUE, f"{QUEUE}.record", Jsonb({"args": [{"key": "o", "seq": 0}], "kwargs": {}, "options": {}})),
            )
            conn.execute("SELECT pg_notify(%s, 'orders')", (store.WAKE_CHANNEL,))
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM orders.outbox") == 0, timeout=10)
        # Far sooner than the 60 s poll: the relay remembered when pingpong's row falls due.
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0, timeout=20)


@pytest.mark.heavy
def test_several_relays_keep_every_key_in_order_and_lose_nothing(conn, runtime, stub_broker, queue, database_url):
    keys = [f"k{i}" for i in range(12)]
    expected: dict[str | None, list[int]] = {key: [] for key in keys}

    def write(my_keys: list[str], seqs: range) -> None:
        # Each writer owns its keys, so each key's commit order is the writer's order.
        with psycopg.connect(database_url, autocommit=True) as writer:
            for seq in seqs:
                with writer.transaction():
                    for key in random.sample(my_keys, k=2):
                        add(writer, key, seq)
                        expected[key].append(seq)

    def writers(seqs: range) -> list[threading.Thread]:
        threads = [threading.Thread(target=write, args=(keys[i::3], seqs)) for i in range(3)]
        for thread in threads:
            thread.start()
        return threads

    for thread in writers(range(30)):  # a backlog the relays start on together
        thread.join()
    relays = [make_relay(runtime, stub_broker, batch_size=7, poll_interval=0.02) for _ in range(3)]
    stop = threading.Event()
    threads = [threading.Thread(target=r.run, args=(stop,), daemon=True) for r in relays]
    for thread in threads:
        thread.start()
    try:
        for thread in writers(range(30, 60)):  # and more rows while they run
            thread.join()
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0, timeout=60)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert check_order(arrivals(drain_stub(stub_broker)), expected) == 0
    assert sum(map(len, expected.values())) == 360


def test_retry_puts_a_failed_row_back_and_counts_from_zero(conn, runtime, stub_broker, queue) -> None:
    relay = make_relay(runtime, stub_broker, max_attempts=1)
    add(conn, None, 0, queue="nowhere")
    relay.drain_once()
    (failed,) = outbox_admin.list_failed(conn, SCHEMA)
    assert failed["attempts"] == 1 and "nowhere" in failed["last_error"]
    assert outbox_admin.retry_failed(conn, SCHEMA, failed["id"] + 1) == []
    assert outbox_admin.retry_failed(conn, SCHEMA, failed["id"]) == [failed["id"]]
    assert scalar(conn, "SELECT attempts FROM pingpong.outbox") == 0


def test_metrics_count_batches_and_read_the_outbox_when_scraped(conn, runtime, stub_broker, queue) -> None:
    from prometheus_client import REGISTRY

    from estafeta_brokers import metrics

    def sample(name: str) -> float:
        return REGISTRY.get_sample_value(name, {"service": SCHEMA}) or 0.0

    before = {n: sample(n) for n in ("estafeta_outbox_published_total", "estafeta_outbox_publish_failed_total")}
    latencies = sample("estafeta_outbox_publish_latency_seconds_count")
    relay = make_relay(runtime, stub_broker)
    for seq in range(5):
        add(conn, None, seq)
    add(conn, "k", 0, queue="nowhere")
    add(conn, "k", 1)
    assert relay.drain_once() == 5
    assert sample("estafeta_outbox_published_total") - before["estafeta_outbox_published_total"] == 5
    assert sample("estafeta_outbox_publish_failed_total") - before["estafeta_outbox_publish_failed_total"] >= 1
    assert sample("estafeta_outbox_publish_latency_seconds_count") - latencies == 5
    server = metrics.serve(0, relay.outboxes, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
    assert 'estafeta_outbox_pending_count{service="pingpong"} 2.0' in text
    assert 'estafeta_outbox_failed_count{service="pingpong"} 0.0' in text
    assert 'estafeta_outbox_oldest_pending_age_seconds{service="pingpong"}' in text
    assert 'estafeta_outbox_publish_latency_seconds_bucket{le="0.1",service="pingpong"}' in text


@pytest.mark.parametrize(("poll", "notify"), [(60.0, True), (0.2, False)], ids=["woken-by-notify", "found-by-poll"])
def test_the_relay_is_woken_by_notify_and_polls_for_what_it_missed(conn, runtime, stub_broker, queue, poll, notify):
    relay = make_relay(runtime, stub_broker, poll_interval=poll)
    with running(relay):
        if notify:
            add(conn, "k", 0)
        else:  # a lost wake-up: written without the NOTIFY, only the poll can find it
            conn.execute(
                "INSERT INTO pingpong.outbox (message_id, queue_name, actor_name, message, ordering_key)"
                " VALUES (gen_random_uuid(), %s, %s, %s, 'k')",
                (QUEUE, f"{QUEUE}.record", Jsonb({"args": [{"key": "k", "seq": 0}], "kwargs": {}, "options": {}})),
            )
        # With a 60 s poll, only the NOTIFY can explain a publish within seconds.
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0, timeout=10)
    assert check_order(arrivals(drain_stub(stub_broker)), {"k": [0]}) == 0
