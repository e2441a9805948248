"""``estafeta_sql.pool.notifications``: what a LISTENing connection received, waited for in select() (real PostgreSQL).

The wait itself is why it exists (psycopg's timed wait spins through its last millisecond:
``bench.relay_idle`` shows the relay's idle CPU); these tests hold what it must still do:
return what came as soon as it comes, what came while the connection ran a statement, and
nothing once the time is up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from estafeta_sql.pool import notifications


@pytest.fixture
def listening(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN estafeta_test_channel")
        yield listener


def test_notifications_come_as_soon_as_sent_all_of_them(listening: psycopg.Connection[Any], conn) -> None:
    sender = threading.Timer(
        0.2, lambda: conn.execute("NOTIFY estafeta_test_channel, 'a'; NOTIFY estafeta_test_channel, 'b'")
    )
    sender.start()
    started = time.monotonic()
    got = notifications(listening, 30.0)
    sender.join()
    assert [n.payload for n in got] == ["a", "b"]
    assert time.monotonic() - started < 25.0  # not the timeout: the notifications ended the wait


def test_a_notification_received_while_running_a_statement_is_not_left_behind(
    listening: psycopg.Connection[Any], conn
) -> None:
    conn.execute("NOTIFY estafeta_test_channel, 'early'")
    listening.execute("SELECT 1")  # psycopg reads the notification here and keeps it aside
    assert [n.payload for n in notifications(listening, 0.01)] == ["early"]


def test_nothing_once_the_time_is_up(listening: psycopg.Connection[Any]) -> None:
    assert notifications(listening, 0.05) == []


def test_a_closed_connection_raises(database_url: str) -> None:
    listener = psycopg.connect(database_url, autocommit=True)
    try:
        listener.execute("LISTEN estafeta_test_channel")
        with psycopg.connect(database_url, autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", (listener.info.backend_pid,))
        # The server's reason comes first, then the end of the connection: a listener's next
        # call or so raises (and reconnects), where one that never did would spin on select().
        with pytest.raises(psycopg.OperationalError):
            for _ in range(10):
                notifications(listener, 5.0)
    finally:
        listener.close()
