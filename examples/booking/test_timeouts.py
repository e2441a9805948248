"""Copy me: a saga's 30-second timeout tested in milliseconds, with estafeta's pytest plugin.

The plugin comes with estafeta (entry point ``estafeta.testing``); tell it which app is
under test in the pytest configuration (``estafeta_app = "examples.booking:app"``), or run
``pytest -p estafeta.testing -o estafeta_app=examples.booking:app examples/booking``.
It needs a PostgreSQL server (libpq's environment, or ``ESTAFETA_TEST_DATABASE_URL``).
"""

from __future__ import annotations

from datetime import timedelta

import examples.booking as booking
from estafeta.testing import AppUnderTest, VirtualClock


def test_a_booking_is_charged(estafeta_app: AppUnderTest) -> None:
    with estafeta_app.runtime.database("desk").transaction() as tx:
        tx.execute("INSERT INTO desk.wallets (guest, balance) VALUES ('ann', 500)")
        saga_id = booking.book(tx, "ann", 2)
    assert [m.args[0]["amount"] for m in estafeta_app.sent_to("desk")] == [200]
    estafeta_app.run_until_idle()
    assert estafeta_app.transitions("booking", saga_id) == [
        ("started", "running", "charge"),
        ("completed", "completed", "charge"),
    ]


def test_an_unanswered_charge_is_sent_again_then_the_booking_is_cancelled(
    estafeta_app: AppUnderTest, clock: VirtualClock
) -> None:
    with estafeta_app.runtime.database("desk").transaction() as tx:
        tx.execute("INSERT INTO desk.wallets (guest, balance) VALUES ('ann', 500)")
        saga_id = booking.book(tx, "ann", 2)
    assert len(estafeta_app.drop("desk.charge")) == 1  # lost on the way: nobody answers

    # The step waits 30 s for an answer: nothing happens at 29 s, the charge is sent again at 31 s.
    assert clock.advance(timedelta(seconds=29)).watchdog == {}
    assert clock.advance(timedelta(seconds=2)).watchdog == {"resent": 1}
    assert len(estafeta_app.drop("desk.charge")) == 1  # lost again
    # Each send waits longer (60 s, then 90 s); the third unanswered one gives up.
    assert clock.advance(timedelta(seconds=61)).watchdog == {"resent": 1}
    assert len(estafeta_app.drop("desk.charge")) == 1
    assert clock.advance(timedelta(seconds=91)).watchdog == {"compensating": 1}

    estafeta_app.run_until_idle()  # the compensation cancels the booking
    assert [event for event, _, _ in estafeta_app.transitions("booking", saga_id)] == [
        "started",
        "resent",
        "resent",
        "compensating",
        "compensated",
    ]
    with estafeta_app.runtime.database("desk").connection() as conn:
        assert conn.execute("SELECT paid, cancelled FROM desk.bookings").fetchall() == [(False, True)]
