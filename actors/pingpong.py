"""The ping service: the smallest real round trip through outbox, relay, broker and inbox.

``estafeta ping`` writes a :class:`Ping` to the outbox; the ``pingpong.ping`` step records
it and sends a :class:`Pong` in the same transaction; ``pingpong.pong`` marks it answered.
Operators use it to check that relay, broker and workers are all wired.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import attrs
import psycopg

from estafeta import Service, StepContext

from .migrations import MIGRATIONS

SERVICE = Service("pingpong", migrations=MIGRATIONS / "pingpong")


@attrs.frozen
class Ping:
    """Asks the ping step to record a ping and answer it."""

    ping_id: uuid.UUID
    sent_at: datetime


@attrs.frozen
class Pong:
    """The answer to a :class:`Ping`."""

    ping_id: uuid.UUID


@SERVICE.step(Ping)
def ping(ctx: StepContext, command: Ping) -> None:
    """Record the ping and send its pong, atomically."""
    ctx.conn.execute(
        "INSERT INTO pingpong.pings (ping_id, sent_at) VALUES (%s, %s)", (command.ping_id, command.sent_at)
    )
    ctx.send(Pong(command.ping_id), ordering_key=str(command.ping_id))


@SERVICE.step(Pong)
def pong(ctx: StepContext, command: Pong) -> None:
    """Mark the ping answered; ``pongs`` counts effects, so a duplicate would show as 2."""
    ctx.conn.execute(
        "UPDATE pingpong.pings SET ponged_at = now(), pongs = pongs + 1 WHERE ping_id = %s",
        (command.ping_id,),
    )


def send_ping(conn: psycopg.Connection[Any]) -> uuid.UUID:
    """Write a ping into the outbox on ``conn`` (inside the caller's transaction); return its id."""
    ping_id = uuid.uuid4()
    SERVICE.send(conn, Ping(ping_id, datetime.now(UTC)))
    return ping_id


def ping_status(conn: psycopg.Connection[Any], ping_id: uuid.UUID) -> tuple[bool, int]:
    """Whether ``ping_id`` was answered, and how many times its pong took effect."""
    row = conn.execute(
        "SELECT ponged_at IS NOT NULL, pongs FROM pingpong.pings WHERE ping_id = %s", (ping_id,)
    ).fetchone()
    return (bool(row[0]), int(row[1])) if row else (False, 0)
