"""The relay is fair across outboxes and never stops on its own: StubBroker and real PostgreSQL."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from estafeta_brokers.outboxes import Outbox
from estafeta_brokers.publish import EnqueuePublisher, Publisher, PublishOutcome
from estafeta_brokers.relay import Relay, RelayConfig
from estafeta_sql import outbox as store
from estafeta_sql import outbox_admin
from estafeta_sql.outbox import OutboxRow

from .conftest import make_relay
from .helpers import scalar, wait_until
from .relay_support import QUEUE, add, drain_stub


@pytest.fixture
def queue(stub_broker: Any) -> str:
    stub_broker.declare_queue(QUEUE)
    return QUEUE


def add_to(conn: Any, schema: str, seq: int) -> None:
    store.insert(
        conn,
        schema,
        store.OutgoingMessage(
            message_id=uuid.uuid4(),
            queue_name=QUEUE,
            actor_name=f"{QUEUE}.record",
            args=[{"key": schema, "seq": seq}],
        ),
    )


def test_a_flooded_outbox_does_not_starve_another_one(conn, runtime, stub_broker, queue) -> None:
    relay = make_relay(runtime, stub_broker, batch_size=10)
    with conn.transaction():
        for seq in range(1_000):  # a steady flood on one service...
            add(conn, None, seq)
    add_to(conn, "probe", 0)  # ...and one row of another service, written after it
    assert relay.drain_once() == 1_001
    arrived = [m.args[0]["key"] for m in drain_stub(stub_broker)]
    # Round robin, one batch per outbox: out within the first round of batches.
    assert arrived.index("probe") < 2 * 10


def test_the_outbox_served_first_changes_from_one_drain_to_the_next(conn, runtime, stub_broker, queue) -> None:
    outboxes = [Outbox(name, runtime.database(name)) for name in ("pingpong", "probe")]
    relay = Relay(outboxes, EnqueuePublisher(stub_broker), RelayConfig(batch_size=10))
    firsts = []
    for seq in range(2):
        add(conn, "pingpong", seq)
        add_to(conn, "probe", seq)
        relay.drain_once()
        firsts.append(drain_stub(stub_broker)[0].args[0]["key"])
    assert firsts in (["pingpong", "probe"], ["probe", "pingpong"])


class FailingOnce:
    """A publisher with a bug that shows once: it raises something no one expected, then works."""

    def __init__(self, inner: Publisher) -> None:
        self.inner = inner
        self.raised = 0

    def publish(self, rows: Sequence[OutboxRow]) -> PublishOutcome:
        if not self.raised:
            self.raised += 1
            raise TypeError("an unexpected bug in a publisher")
        return self.inner.publish(rows)

    def close(self) -> None:
        self.inner.close()


def test_an_unexpected_error_in_a_lane_is_logged_and_the_lane_carries_on(
    conn, runtime, stub_broker, queue, caplog: pytest.LogCaptureFixture
) -> None:
    relay = make_relay(runtime, stub_broker, poll_interval=0.05)
    relay.publisher = FailingOnce(relay.publisher)
    for seq in range(3):
        add(conn, "k", seq)
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    with caplog.at_level(logging.ERROR, logger="estafeta_brokers.relay"):
        thread.start()
        try:
            # The failed batch rolled back: its rows are claimed again once the lane has backed off.
            wait_until(lambda: scalar(conn, "SELECT count(*) FROM pingpong.outbox") == 0, timeout=10)
            assert thread.is_alive()
        finally:
            stop.set()
            thread.join(10)
    assert [m.args[0]["seq"] for m in drain_stub(stub_broker)] == [0, 1, 2]
    assert any("an unexpected bug in a publisher" in r.getMessage() or r.exc_info for r in caplog.records)
    assert not thread.is_alive()  # and SIGTERM (the stop event) still stops it


def test_a_row_that_cannot_be_encoded_fails_alone(conn, runtime, stub_broker, queue) -> None:
    relay = make_relay(runtime, stub_broker, max_attempts=1)
    conn.execute(
        "INSERT INTO pingpong.outbox (message_id, queue_name, actor_name, message, ordering_key)"
        " VALUES (gen_random_uuid(), %s, %s, %s, 'k')",
        (QUEUE, f"{QUEUE}.record", Jsonb(["not", "an object"])),  # written by hand, or by a bug
    )
    add(conn, "k", 1)  # behind the bad row: waits, in order
    add(conn, "other", 0)
    assert relay.drain_once() == 1
    assert [m.args[0]["key"] for m in drain_stub(stub_broker)] == ["other"]
    (failed,) = outbox_admin.list_failed(conn, "pingpong")
    assert failed["last_error"] and "AttributeError" in failed["last_error"]
