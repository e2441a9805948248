"""A whole estafeta app: one service, one migration, two steps, a two-step saga."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import attrs

from estafeta import NOTHING_TO_UNDO, App, BusinessFailure, Saga, SagaStep, Service, StepContext

desk = Service("desk", migrations=Path(__file__).parent / "migrations")
app = App("booking", services=[desk])


@attrs.frozen
class Booking:
    booking_id: uuid.UUID
    guest: str
    nights: int


@attrs.frozen
class Charge:
    booking_id: uuid.UUID
    amount: int


@attrs.frozen
class Cancel:
    booking_id: uuid.UUID


@desk.step(Charge, lock=lambda c: str(c.booking_id))
def charge(ctx: StepContext, command: Charge) -> None:
    """Take the money once per booking (a re-sent command finds it paid)."""
    row = ctx.conn.execute(
        "UPDATE desk.bookings SET paid = true WHERE booking_id = %s AND NOT paid AND NOT cancelled RETURNING guest",
        (command.booking_id,),
    ).fetchone()
    if row is None:
        return  # paid already (the command was sent again), or cancelled
    taken = ctx.conn.execute(
        "UPDATE desk.wallets SET balance = balance - %s WHERE guest = %s AND balance >= %s",
        (command.amount, row[0], command.amount),
    ).rowcount
    if not taken:
        raise BusinessFailure(f"{row[0]} cannot pay {command.amount}")


@desk.step(Cancel, lock=lambda c: str(c.booking_id))
def cancel(ctx: StepContext, command: Cancel) -> None:
    """Undo the booking (the saga's compensation when the charge is refused)."""
    ctx.conn.execute("UPDATE desk.bookings SET cancelled = true WHERE booking_id = %s", (command.booking_id,))


BOOKING = Saga(
    "booking",
    service=desk,
    data=Booking,
    key="booking_id",
    steps=[
        SagaStep("book", compensation=lambda s: Cancel(s.data.booking_id)),  # done by book() below
        # The last step: once it is done the saga is over, and a refused charge took nothing.
        SagaStep(
            "charge", action=lambda s: Charge(s.data.booking_id, 100 * s.data.nights), compensation=NOTHING_TO_UNDO
        ),
    ],
)


def book(conn: Any, guest: str, nights: int) -> uuid.UUID:
    """Book, and start the saga that charges for it, in the caller's transaction; return the saga id."""
    booking = Booking(uuid.uuid4(), guest, nights)
    conn.execute("INSERT INTO desk.bookings (booking_id, guest, nights) VALUES (%s, %s, %s)", attrs.astuple(booking))
    return BOOKING.start(conn, booking)


#: ``dramatiq`` imports this module (the workers' command names it): bind the app to ESTAFETA_BROKER_URL's broker.
broker = app.bind().broker
