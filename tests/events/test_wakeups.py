"""ESTAFETA_WAKEUP on real PostgreSQL: who NOTIFYs under each policy, and the relay and projectors still get the rows.

The ledger's deposit step appends an event (the events trigger's NOTIFY wakes projectors)
and writes an outbox row (``Noted``, whose NOTIFY wakes the relay); ``Noted`` is a step
too, so it runs only once the relay published the deposit step's row.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from dramatiq.brokers.stub import StubBroker

from estafeta import Runtime, Settings, running

from ..helpers import scalar, wait_until
from ..services import scratch_database
from .ledger import Deposit, app, ledger

CHANNELS = ("estafeta_outbox", "estafeta_events")

#: About 2 s each: a worker, a relay and projectors started and stopped.
pytestmark = pytest.mark.heavy


@pytest.fixture
def dsn() -> Iterator[str]:
    with scratch_database() as found:
        yield found


def _runtime(dsn: str, wakeup: str) -> Runtime:
    runtime = Runtime(Settings(database_url=dsn, wakeup=wakeup, max_retries=5, min_backoff_ms=10, max_backoff_ms=50))
    app.migrate(runtime)
    return runtime


class Heard:
    """Every notification on the outbox and events channels, with the sender's ``application_name``."""

    def __init__(self, dsn: str) -> None:
        self.notes: list[tuple[str, str, str]] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._dsn = dsn
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "the listener did not connect"

    def _listen(self) -> None:
        with (
            psycopg.connect(self._dsn, autocommit=True) as conn,
            psycopg.connect(self._dsn, autocommit=True) as lookup,
        ):
            for channel in CHANNELS:
                conn.execute(f"LISTEN {channel}")
            self._ready.set()
            while not self._stop.is_set():
                for note in conn.notifies(timeout=0.2):
                    row = lookup.execute("SELECT application_name FROM pg_stat_activity WHERE pid = %s", (note.pid,))
                    found = row.fetchone()
                    self.notes.append((note.channel, note.payload, found[0] if found else "?"))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def senders(self, channel: str) -> set[str]:
        return {sender for heard, _payload, sender in self.notes if heard == channel}


def _noted(conn: psycopg.Connection[Any]) -> int:
    return int(scalar(conn, "SELECT count(*) FROM ledger.inbox WHERE consumer = 'ledger.noted'"))


def _balance(conn: psycopg.Connection[Any]) -> int | None:
    try:
        row = conn.execute("SELECT balance FROM ledger.balances WHERE account = 'account-ann'").fetchone()
    except psycopg.errors.UndefinedTable:  # the projection creates it
        return None
    return int(row[0]) if row else None


@pytest.mark.parametrize("wakeup", ["notify", "after-commit"])
def test_a_step_wakes_the_relay_and_the_projectors_long_before_their_poll(dsn: str, wakeup: str) -> None:
    runtime = _runtime(dsn, wakeup)
    heard = Heard(dsn)
    try:
        binding = app.bind(StubBroker(), runtime)
        # A 60 s relay poll: the Noted step runs within seconds only if the deposit step's
        # commit woke the relay.
        with running(binding, poll_interval=60.0), psycopg.connect(dsn, autocommit=True) as conn:
            with runtime.database("ledger").transaction() as send:
                ledger.send(send, Deposit("ann", 30))
            wait_until(lambda: _noted(conn) == 1, timeout=20, what="Noted, published by a woken relay")
            wait_until(lambda: _balance(conn) == 30, timeout=20, what="the Balances projection")
            # The events channel is NOTIFYed by the deposit step only (the test's own send appends no event).
            wait_until(lambda: heard.senders("estafeta_events"), timeout=5, what="a wake-up for the projectors")
            time.sleep(0.5)  # past the waker's round after the Noted step's commit
    finally:
        heard.stop()
        runtime.close()
    if wakeup == "after-commit":
        # Not one wake-up from the steps' own transactions: the waker's connection sent them.
        assert heard.senders("estafeta_events") == {"estafeta-waker"}
        # The relays are woken for the deposit step's Noted, not for the Noted step, which sent nothing.
        assert [n for n in heard.notes if n[0] == "estafeta_outbox" and n[2] == "estafeta-waker"] == [
            ("estafeta_outbox", "ledger", "estafeta-waker")
        ]
    else:
        assert "estafeta-waker" not in heard.senders("estafeta_events") | heard.senders("estafeta_outbox")
    assert {payload for _c, payload, _s in heard.notes} == {"ledger"}


def test_under_poll_nothing_notifies_and_the_polls_find_every_row(dsn: str) -> None:
    runtime = _runtime(dsn, "poll")
    heard = Heard(dsn)
    try:
        binding = app.bind(StubBroker(), runtime)
        with running(binding, poll_interval=0.1), psycopg.connect(dsn, autocommit=True) as conn:
            with runtime.database("ledger").transaction() as send:
                ledger.send(send, Deposit("ann", 30))
            wait_until(lambda: _noted(conn) == 1, timeout=20, what="Noted, found by the relay's poll")
            wait_until(lambda: _balance(conn) == 30, timeout=20, what="Balances, found by the projector's poll")
    finally:
        heard.stop()
        runtime.close()
    assert heard.notes == []
