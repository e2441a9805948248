"""Scheduled messages have an identity: send returns it, and an operator lists, cancels and moves them.

Cancel and reschedule race the relay for real: a relay thread holds its claim
transaction open (its publisher waits inside the batch) while another connection
cancels; exactly one of them wins, and the loser says so.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from dramatiq.brokers.stub import StubBroker

from estafeta import (
    Clock,
    MessageAlreadyPublished,
    MessageBeingPublished,
    Runtime,
    ScheduledMessageRefused,
    aio,
    cancel,
    reschedule,
)
from estafeta_actors.pingpong import SERVICE, Ping
from estafeta_brokers.outboxes import Outbox
from estafeta_brokers.publish import EnqueuePublisher, PublishOutcome
from estafeta_brokers.relay import Relay, RelayConfig
from estafeta_sql.outbox import OutboxRow

from .helpers import scalar
from .integration.processes import service_env
from .test_cli import run

SCHEMA = SERVICE.name


def _send(runtime: Runtime, **options: Any) -> uuid.UUID:
    with runtime.database(SCHEMA).transaction() as tx:
        return SERVICE.send(tx, Ping(uuid.uuid4(), datetime.now(UTC)), **options)


def _drain(relay: Relay) -> int:
    total = 0
    while published := relay.drain_once():
        total += published
    return total


@pytest.fixture
def clock(runtime: Runtime) -> Iterator[Clock]:
    clock = Clock(runtime, [SCHEMA])
    yield clock
    clock.reset()


def test_send_with_delay_or_at_returns_the_id_of_its_outbox_row(runtime: Runtime, conn: psycopg.Connection[Any]):
    delayed = _send(runtime, delay=timedelta(minutes=5))
    when = datetime(2040, 1, 1, 12, tzinfo=UTC)
    at = _send(runtime, at=when)
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox WHERE message_id = %s", delayed) == 1
    assert scalar(conn, "SELECT available_at FROM pingpong.outbox WHERE message_id = %s", at) == when
    with runtime.database(SCHEMA).transaction() as tx:
        with pytest.raises(ValueError, match="delay= or at="):
            SERVICE.send(tx, Ping(uuid.uuid4(), when), delay=1, at=when)
        with pytest.raises(ValueError, match="timezone-aware"):
            SERVICE.send(tx, Ping(uuid.uuid4(), when), at=datetime(2040, 1, 1))


def test_cancel_takes_the_message_out_and_a_second_cancel_or_reschedule_is_refused(
    runtime: Runtime, stub_broker: StubBroker, relay: Relay, clock: Clock
):
    message_id = _send(runtime, delay=timedelta(hours=1))
    with runtime.database(SCHEMA).transaction() as tx:
        cancel(tx, message_id, service=SCHEMA)
    with runtime.database(SCHEMA).transaction() as tx:
        with pytest.raises(MessageAlreadyPublished, match=f"cannot cancel message {message_id}: not in pingpong"):
            SERVICE.cancel(tx, message_id)
        with pytest.raises(MessageAlreadyPublished, match="already published, cancelled, or never sent"):
            reschedule(tx, uuid.uuid4(), datetime.now(UTC), service=SCHEMA)
    clock.advance(timedelta(hours=2))
    assert _drain(relay) == 0


def test_a_cancel_rolled_back_leaves_the_message_to_the_relay(
    runtime: Runtime, relay: Relay, clock: Clock, database_url: str
):
    message_id = _send(runtime, delay=timedelta(minutes=1))
    clock.advance(timedelta(minutes=2))
    with psycopg.connect(database_url, autocommit=True) as other, other.transaction():
        SERVICE.cancel(other, message_id)
        # While the cancel's transaction holds the row, the relay skips it.
        assert _drain(relay) == 0
        raise psycopg.Rollback
    assert _drain(relay) == 1


class HeldPublisher:
    """Publishes through the StubBroker, but only once the test lets it: the claim stays open meanwhile."""

    def __init__(self, broker: StubBroker) -> None:
        self.inner = EnqueuePublisher(broker)
        self.claimed = threading.Event()
        self.release = threading.Event()

    def publish(self, rows: Sequence[OutboxRow]) -> PublishOutcome:
        self.claimed.set()
        assert self.release.wait(60), "the test never released the publish"
        return self.inner.publish(rows)


def test_cancel_racing_the_relay_s_publish_loses_and_says_so(runtime: Runtime, stub_broker: StubBroker):
    message_id = _send(runtime)
    publisher = HeldPublisher(stub_broker)
    relay = Relay([Outbox(SCHEMA, runtime.database(SCHEMA))], publisher, RelayConfig(batch_size=10))
    published: list[int] = []
    thread = threading.Thread(target=lambda: published.append(relay.drain_once()))
    thread.start()
    try:
        assert publisher.claimed.wait(60)
        # The relay's batch transaction holds the row: cancel and reschedule neither wait nor win.
        with runtime.database(SCHEMA).transaction() as tx:
            with pytest.raises(MessageBeingPublished, match="already being published"):
                cancel(tx, message_id, service=SCHEMA)
            with pytest.raises(MessageBeingPublished, match="cannot reschedule"):
                reschedule(tx, message_id, datetime(2040, 1, 1, tzinfo=UTC), service=SCHEMA)
    finally:
        publisher.release.set()
        thread.join(60)
    assert published == [1]
    assert len(stub_broker.queues["pingpong"].queue) == 1
    with (
        runtime.database(SCHEMA).transaction() as tx,
        pytest.raises(MessageAlreadyPublished, match="not in pingpong's outbox"),
    ):
        cancel(tx, message_id, service=SCHEMA)


def test_a_cancel_holding_the_row_makes_the_relay_skip_it_and_wins(
    runtime: Runtime, stub_broker: StubBroker, relay: Relay
):
    message_id = _send(runtime)
    with runtime.database(SCHEMA).transaction() as tx:
        cancel(tx, message_id, service=SCHEMA)
        assert relay.drain_once() == 0  # the relay's claim skips the row the cancel holds
    assert _drain(relay) == 0
    assert "pingpong" not in stub_broker.queues or not stub_broker.queues["pingpong"].queue


def test_a_rescheduled_message_publishes_at_its_new_time_not_the_old_one(
    runtime: Runtime, relay: Relay, clock: Clock, conn: psycopg.Connection[Any]
):
    start = datetime(2031, 3, 1, 9, tzinfo=UTC)
    clock.set(start)
    later = _send(runtime, at=start + timedelta(hours=1))
    sooner = _send(runtime, at=start + timedelta(hours=1))
    with runtime.database(SCHEMA).transaction() as tx:
        SERVICE.reschedule(tx, later, start + timedelta(hours=3))
        SERVICE.reschedule(tx, sooner, start + timedelta(minutes=10))

    clock.advance(timedelta(minutes=11))
    assert _drain(relay) == 1
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox WHERE message_id = %s", sooner) == 0
    clock.advance(timedelta(hours=1))  # the old time of `later`
    assert _drain(relay) == 0
    clock.advance(timedelta(hours=2))
    assert _drain(relay) == 1
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0


def test_a_failed_row_cannot_be_rescheduled_but_can_be_cancelled(runtime: Runtime, conn: psycopg.Connection[Any]):
    message_id = _send(runtime)
    conn.execute("UPDATE pingpong.outbox SET status = 'failed' WHERE message_id = %s", (message_id,))
    with (
        runtime.database(SCHEMA).transaction() as tx,
        pytest.raises(ScheduledMessageRefused, match="failed for good"),
    ):
        reschedule(tx, message_id, datetime.now(UTC), service=SCHEMA)
    with runtime.database(SCHEMA).transaction() as tx:
        cancel(tx, message_id, service=SCHEMA)


@pytest.mark.heavy
def test_the_cli_lists_cancels_and_reschedules_and_refuses_with_exit_2(database_url: str, runtime: Runtime):
    env = service_env(database_url, "stub://")
    first = _send(runtime, at=datetime(2040, 1, 1, tzinfo=UTC))
    second = _send(runtime, delay=timedelta(days=1))
    _send(runtime)  # due now: not scheduled

    listed = run(env, "outbox", "scheduled", "--service", "pingpong", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["message_id"] for r in rows] == [str(second), str(first)]
    assert rows[1]["message_type"] == "estafeta_actors.pingpong.Ping" and rows[1]["available_at"].startswith(
        "2040-01-01"
    )

    moved = run(env, "outbox", "reschedule", str(first), "--at", "2039-06-01T10:00:00+02:00")
    assert moved.returncode == 0, moved.stderr
    text = run(env, "outbox", "scheduled").stdout
    assert f"2039-06-01 08:00:00 UTC  pingpong  {first}  estafeta_actors.pingpong.Ping" in text

    assert run(env, "outbox", "cancel", str(first)).returncode == 0
    again = run(env, "outbox", "cancel", str(first))
    assert again.returncode == 2
    assert f"message {first} is in no outbox of" in again.stderr
    assert "already published, cancelled, or never sent" in again.stderr

    for args, error in [
        (["reschedule", str(second), "--at", "tomorrow"], "is not an ISO 8601 time"),
        (["reschedule", str(second), "--at", "2040-01-01T00:00:00"], "has no time zone"),
        (["cancel", "not-a-uuid"], "not a valid UUID"),
    ]:
        refused = run(env, "outbox", *args)
        assert refused.returncode == 2 and error in refused.stderr, refused.stderr
    assert [r["message_id"] for r in json.loads(run(env, "outbox", "scheduled", "--json").stdout)] == [str(second)]


def test_async_code_cancels_and_reschedules_with_the_same_refusals(database_url: str, runtime: Runtime, conn):
    moved = _send(runtime, delay=timedelta(hours=1))
    dropped = _send(runtime, delay=timedelta(hours=1))
    when = datetime(2040, 1, 1, tzinfo=UTC)

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            async with aconn.transaction():
                await aio.reschedule(aconn, SERVICE, moved, when)
                await aio.cancel(aconn, SERVICE, dropped)
            async with aconn.transaction():
                with pytest.raises(MessageAlreadyPublished, match="cannot cancel"):
                    await aio.cancel(aconn, SERVICE, dropped)

    asyncio.run(main())
    assert scalar(conn, "SELECT available_at FROM pingpong.outbox WHERE message_id = %s", moved) == when
    assert scalar(conn, "SELECT count(*) FROM pingpong.outbox WHERE message_id = %s", dropped) == 0
