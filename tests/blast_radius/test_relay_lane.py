"""One poisoned key in a relay lane: a live workload goes on around it, and the key says why it waits.

A relay runs in a thread (real PostgreSQL, the StubBroker) while a writer keeps adding rows
of twenty keys and keyless rows. Before it starts, key ``poison`` got a head row the relay
cannot encode (written by hand, or by a bug) and 10,000 rows behind it. The relay fails
that row, and the key's backlog waits for an operator; every other row goes out in its
key's order, and ``estafeta outbox`` shows the stuck key with its reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from ..conftest import make_relay
from ..helpers import scalar, wait_until
from ..integration.processes import ROOT, service_env
from ..relay_support import QUEUE, add, arrivals, check_order, drain_stub

#: Rows of the poisoned key behind its head.
BEHIND = 10_000
KEYS = [f"k{i}" for i in range(20)]


def poison(conn: psycopg.Connection[Any]) -> None:
    """A head row for key ``poison`` that is not a Dramatiq message body, and ``BEHIND`` good rows after it."""
    conn.execute(
        "INSERT INTO pingpong.outbox (message_id, queue_name, actor_name, message, ordering_key)"
        " VALUES (gen_random_uuid(), %s, %s, %s, 'poison')",
        (QUEUE, f"{QUEUE}.record", Jsonb(["not", "an object"])),
    )
    body = Jsonb({"args": [{"key": "poison", "seq": 0}], "kwargs": {}, "options": {}})
    conn.execute(
        "INSERT INTO pingpong.outbox (message_id, queue_name, actor_name, message, ordering_key)"
        " SELECT gen_random_uuid(), %s, %s, %s, 'poison' FROM generate_series(1, %s)",
        (QUEUE, f"{QUEUE}.record", body, BEHIND),
    )


def write_workload(database_url: str, expected: dict[str | None, list[int]], rounds: int) -> None:
    """``rounds`` transactions, each one row of every key and one keyless row."""
    with psycopg.connect(database_url, autocommit=True) as writer:
        for seq in range(rounds):
            with writer.transaction():
                for key in [*KEYS, None]:
                    add(writer, key, seq)
                    expected[key].append(seq)


def cli(database_url: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "estafeta_cli", "outbox", *args],
        cwd=ROOT,
        env=service_env(database_url, "stub://"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture
def lane(runtime, stub_broker) -> Iterator[threading.Thread]:
    """A relay that fails a row at its first refusal, to run in a thread (started by the test) while the test lasts."""
    stub_broker.declare_queue(QUEUE)
    relay = make_relay(runtime, stub_broker, max_attempts=1, poll_interval=1.0)
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    yield thread
    stop.set()
    thread.join(10)


def test_a_poisoned_key_stops_only_itself_and_says_why(conn, database_url: str, stub_broker, lane) -> None:
    poison(conn)
    thread = lane
    thread.start()
    expected: dict[str | None, list[int]] = {key: [] for key in [*KEYS, None]}
    write_workload(database_url, expected, rounds=20)
    # Every other row is out within a bound, though 10,000 rows of the poisoned key come first.
    wait_until(
        lambda: scalar(conn, "SELECT count(*) FROM pingpong.outbox WHERE ordering_key IS DISTINCT FROM 'poison'") == 0,
        timeout=30,
        what="every row but the poisoned key's published",
    )
    assert check_order(arrivals(drain_stub(stub_broker)), expected) == 0
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox WHERE ordering_key = 'poison'") == BEHIND + 1
    assert thread.is_alive()
    # The operator sees the stuck key, the row that stops it, and why.
    (line,) = cli(database_url, "failed").splitlines()
    assert line.startswith("pingpong #1 relaycheck.record key=poison attempts=1: AttributeError"), line
    stats = json.loads(cli(database_url, "stats", "--json"))["pingpong"]
    assert stats["blocked_keys"] == 1 and stats["failed"] == 1
    assert stats["pending"] == BEHIND
