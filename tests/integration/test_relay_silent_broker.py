"""The relay against a broker that accepts TCP connections and never says a word.

Each step of a connection (the handshake, a health check, a script load) may wait for an
answer; the relay bounds the whole attempt by its confirm timeout, so it warns within that
bound whatever step the silence hits, and carries on trying.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..helpers import scalar, wait_until
from ..relay_support import add
from . import processes
from .relay_faults import with_port

# Heavy: the relay holds its claim's transaction (row locks, a transaction id) while it waits
# out the broker, up to the 15 s bound, and the server's oldest open transaction holds back
# every event-log reader of the server (pg_snapshot_xmin): beside the suite's other tests it
# would stall their readers. make test-heavy runs its tests one at a time.
pytestmark = [pytest.mark.integration, pytest.mark.heavy]

#: The bound the relay's warning states, seconds: its default confirm timeout bounds a whole
#: attempt; RabbitMQ's handshake has the tighter connect timeout (10 s, so a second host is tried in time),
#: Kafka's probe of the cluster before a batch its own 5 s (so an unreachable cluster is reported soon).
BOUNDS = {"redis": 15, "rabbitmq": 10, "kafka": 5}
#: Where each broker's URL comes from: a fixture (a server that answers), or the URL itself
#: (Kafka: only its port matters, the silent server takes its place).
URLS = {"redis": "redis_url", "rabbitmq": "amqp_url", "kafka": "kafka://127.0.0.1:9092"}


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A TCP server on a free port that accepts every connection and never sends a byte; its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted: list[socket.socket] = []
    closing = threading.Event()

    def accept() -> None:
        while not closing.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return  # closed
            accepted.append(connection)  # held open, read from never

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        closing.set()
        listener.close()
        for connection in accepted:
            connection.close()
        thread.join(5)


@pytest.mark.parametrize("broker", ["redis", "rabbitmq", "kafka"])
def test_the_relay_warns_within_its_bound_against_a_broker_that_never_answers(
    broker: str, request: pytest.FixtureRequest, database_url: str, runtime, conn, tmp_path: Path
) -> None:
    url = URLS[broker] if "://" in URLS[broker] else str(request.getfixturevalue(URLS[broker]))
    add(conn, "k", 0)
    with silent_server() as port:
        env = processes.service_env(database_url, with_port(url, port))
        relay = processes.relay(env, tmp_path)  # the default confirm timeout
        with processes.running(relay):
            # Generous: the test waits for the warning, the warning's text states the bound.
            wait_until(lambda: "WARNING" in relay.output(), timeout=180, what="the relay's first warning")
            first = next(line for line in relay.output().splitlines() if "WARNING" in line)
            assert relay.popen.poll() is None  # it carries on
    assert re.search(rf"relay paused .*no answer within {BOUNDS[broker]} s", first), first
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox WHERE attempts = 0") == 1  # not the row's fault
