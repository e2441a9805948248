"""A key whose head row is refused holds back only its own rows, however many it has.

Real PostgreSQL; the StubBroker for a relay running in a thread, RabbitMQ for ``estafeta
relay --once``. A blocked key's backlog is written with one ``INSERT ... SELECT
generate_series``.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from estafeta_brokers.relay import Relay
from estafeta_sql import outbox as store

from .conftest import make_relay
from .helpers import scalar, wait_until
from .integration import processes
from .relay_support import QUEUE, SCHEMA, add, drain_stub

#: Rows of the blocked key behind its failed head: many more than a claim's window.
BEHIND = 10_000


def block_key(conn: psycopg.Connection[Any], key: str, behind: int) -> int:
    """Write a ``failed`` head row for ``key`` and ``behind`` pending rows of ``key`` after it; return the head's id."""
    add(conn, key, 0)
    head = scalar(conn, "SELECT max(id) FROM pingpong.outbox")
    conn.execute(
        "UPDATE pingpong.outbox SET status = 'failed', attempts = 5, last_error = 'refused by the broker'"
        " WHERE id = %s",
        (head,),
    )
    conn.execute(
        "INSERT INTO pingpong.outbox (message_id, queue_name, actor_name, message, ordering_key)"
        " SELECT gen_random_uuid(), queue_name, actor_name, jsonb_set(message, '{args,0,seq}', to_jsonb(n)),"
        " ordering_key FROM pingpong.outbox, generate_series(1, %s) AS n WHERE id = %s",
        (behind, head),
    )
    return int(head)


def write_others(conn: psycopg.Connection[Any]) -> None:
    """Rows written after the blocked key's: two of key ``cold``, one with no key."""
    add(conn, "cold", 0)
    add(conn, "cold", 1)
    add(conn, None, 0)


def left(conn: psycopg.Connection[Any]) -> dict[str | None, int]:
    """Rows still in the outbox, per key."""
    rows = conn.execute("SELECT ordering_key, count(*) FROM pingpong.outbox GROUP BY ordering_key").fetchall()
    return {key: int(count) for key, count in rows}


@pytest.mark.integration
def test_relay_once_publishes_every_other_key_past_a_blocked_backlog(conn, database_url: str, amqp_url: str) -> None:
    block_key(conn, "hot", BEHIND)
    write_others(conn)
    result = processes.estafeta(processes.service_env(database_url, amqp_url), "relay", "--once")
    assert result.returncode == 0, result.stderr
    # Only the blocked key's rows wait: its failed head and everything behind it.
    assert left(conn) == {"hot": BEHIND + 1}


@pytest.fixture
def slow_polling_relay(runtime, stub_broker) -> Relay:
    """A relay that polls every 5 s: anything out sooner came with the batch its wake-up started."""
    stub_broker.declare_queue(QUEUE)
    return make_relay(runtime, stub_broker, poll_interval=5.0)


def test_a_running_relay_publishes_other_keys_within_one_batch_interval(conn, stub_broker, slow_polling_relay) -> None:
    block_key(conn, "hot", BEHIND)
    relay = slow_polling_relay
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: relay.listening and relay.idle.is_set(), timeout=10, what="the relay idle")
        write_others(conn)
        wait_until(
            lambda: left(conn) == {"hot": BEHIND + 1},
            timeout=relay.config.poll_interval,
            what="every other row published",
        )
    finally:
        stop.set()
        thread.join(10)
    arrived = [(m.args[0]["key"], m.args[0]["seq"]) for m in drain_stub(stub_broker)]
    assert arrived == [("cold", 0), ("cold", 1), (None, 0)]


def plans_of_claim(database_url: str, limit: int) -> tuple[list[store.OutboxRow], list[str]]:
    """What ``claim_batch`` claims, and the plan of every statement it ran (auto_explain, sent as NOTICEs)."""
    plans: list[str] = []
    with psycopg.connect(database_url) as claimer:
        claimer.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
        claimer.execute("LOAD 'auto_explain'")
        claimer.execute("SET auto_explain.log_min_duration = 0")
        claimer.execute("SET auto_explain.log_level = 'notice'")
        with claimer.transaction():
            rows = store.claim_batch(claimer, SCHEMA, limit)
    return rows, plans


def test_the_claim_walks_indexes_past_a_blocked_backlog_never_the_table(conn, database_url: str) -> None:
    block_key(conn, "hot", 100_000 - 4)
    write_others(conn)
    conn.execute("ANALYZE pingpong.outbox")
    rows, plans = plans_of_claim(database_url, 500)
    assert [(row.ordering_key, row.message["args"][0]["seq"]) for row in rows] == [("cold", 0), ("cold", 1), (None, 0)]
    shown = "\n\n".join(plans)
    assert any("WITH RECURSIVE" in p for p in plans), shown  # the walk past the window ran
    assert not any("Seq Scan on outbox" in p for p in plans), shown


def test_past_a_backing_off_key_two_lanes_split_the_rest_and_keep_each_key_in_order(conn, database_url: str) -> None:
    add(conn, "slow", 0)
    conn.execute(
        "UPDATE pingpong.outbox SET attempts = 1, last_error = 'nacked', available_at = now() + interval '1 hour'"
    )
    conn.execute(
        "INSERT INTO pingpong.outbox (message_id, queue_name, actor_name, message, ordering_key)"
        " SELECT gen_random_uuid(), queue_name, actor_name, message, ordering_key"
        " FROM pingpong.outbox, generate_series(1, 3000)"
    )
    add(conn, "cold", 0)
    add(conn, None, 0)
    add(conn, "cold", 1)
    add(conn, None, 1)
    add(conn, "cold", 2, delay=timedelta(hours=1))

    def seqs(rows: list[store.OutboxRow]) -> list[tuple[str | None, int]]:
        return [(row.ordering_key, row.message["args"][0]["seq"]) for row in rows]

    with psycopg.connect(database_url) as lane_a, psycopg.connect(database_url) as lane_b, lane_a.transaction():
        assert seqs(store.claim_batch(lane_a, SCHEMA, 2)) == [("cold", 0), (None, 0)]
        with lane_b.transaction():
            # Key cold's head is held by lane a: its next row waits; the delayed row is not due.
            assert seqs(store.claim_batch(lane_b, SCHEMA, 10)) == [(None, 1)]
