"""The loyalty app: one service declared outside estafeta, with its own migrations."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import attrs
import psycopg

from estafeta import App, Service, StepContext

SERVICE = Service("loyalty", migrations=Path(__file__).parent / "migrations")

#: The loyalty app: its one service.
app = App("loyalty", services=[SERVICE])


@attrs.frozen
class AwardPoints:
    """Add ``points`` to a customer's balance."""

    customer_id: str
    points: int = attrs.field(validator=attrs.validators.gt(0))


@SERVICE.step(AwardPoints, lock=lambda command: f"loyalty:{command.customer_id}")
def award(ctx: StepContext, command: AwardPoints) -> None:
    """Add the points; the inbox makes a redelivered award count once."""
    ctx.conn.execute(
        """INSERT INTO loyalty.members (customer_id, points) VALUES (%s, %s)
           ON CONFLICT (customer_id) DO UPDATE SET points = members.points + EXCLUDED.points""",
        (command.customer_id, command.points),
    )


def request_award(conn: psycopg.Connection[Any], idempotency_key: str, command: AwardPoints) -> tuple[uuid.UUID, bool]:
    """Accept an award request once per ``idempotency_key``, inside the caller's transaction.

    Returns the command's message id and whether this call accepted it (``False``: the
    key was seen before, and the first request's message id is returned).
    """
    message_id = uuid.uuid4()
    inserted = conn.execute(
        "INSERT INTO loyalty.requests (idempotency_key, message_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
        (idempotency_key, message_id),
    ).rowcount
    if not inserted:
        row = conn.execute(
            "SELECT message_id FROM loyalty.requests WHERE idempotency_key = %s", (idempotency_key,)
        ).fetchone()
        assert row is not None
        return row[0], False
    SERVICE.send(conn, command, message_id=message_id)
    return message_id, True


def points(conn: psycopg.Connection[Any], customer_id: str) -> int:
    """The customer's points (0 for an unknown customer)."""
    row = conn.execute("SELECT points FROM loyalty.members WHERE customer_id = %s", (customer_id,)).fetchone()
    return int(row[0]) if row else 0
