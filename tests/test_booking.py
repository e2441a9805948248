"""The README's minimal app (examples/booking), unit-tested the way its README section shows."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from dramatiq.brokers.stub import StubBroker

import examples.booking as booking
from estafeta import Binding, Runtime, running

from .helpers import scalar, wait_until


@pytest.fixture
def binding(runtime: Runtime) -> Iterator[Binding]:
    """The app bound to a fresh StubBroker, with a worker and the relay running in this process."""
    bound = booking.app.bind(StubBroker(), runtime)
    with running(bound):
        yield bound


def _status(runtime: Runtime, saga_id: uuid.UUID) -> str | None:
    with runtime.database("desk").connection() as conn:
        row = booking.BOOKING.get(conn, saga_id)
    return row.status if row else None


def test_a_booking_is_charged_or_else_cancelled(binding: Binding, conn) -> None:
    runtime = binding.runtime
    with runtime.database("desk").transaction() as tx:
        tx.execute("INSERT INTO desk.wallets (guest, balance) VALUES ('ann', 500), ('bob', 50)")
        paid = booking.book(tx, "ann", 2)
        refused = booking.book(tx, "bob", 2)
    wait_until(lambda: _status(runtime, paid) == "completed", what="ann's booking to complete")
    wait_until(lambda: _status(runtime, refused) == "compensated", what="bob's booking to compensate")
    assert scalar(conn, "SELECT balance FROM desk.wallets WHERE guest = 'ann'") == 300
    assert scalar(conn, "SELECT balance FROM desk.wallets WHERE guest = 'bob'") == 50
    assert scalar(conn, "SELECT paid FROM desk.bookings WHERE guest = 'ann'") is True
    assert scalar(conn, "SELECT cancelled FROM desk.bookings WHERE guest = 'bob'") is True
