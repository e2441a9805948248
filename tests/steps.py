"""Steps that exist only in the tests, on the probe service."""

from __future__ import annotations

import threading
import uuid
from collections import Counter

import attrs

from actors.pingpong import Pong
from estafeta import BusinessFailure, StepContext

from .probe import SERVICE


@attrs.frozen
class Explode:
    """Record a ping, send its pong, then fail (transiently, ``times`` times; always if negative)."""

    ping_id: uuid.UUID
    times: int = -1


@attrs.frozen
class Refuse:
    """Record a ping, send its pong, then refuse for a business reason."""

    ping_id: uuid.UUID


#: Attempts per ping id of ``probe.test_explode``.
ATTEMPTS: Counter[uuid.UUID] = Counter()
_attempts_lock = threading.Lock()


def _record_and_send(ctx: StepContext, ping_id: uuid.UUID) -> None:
    ctx.conn.execute("INSERT INTO probe.pings (ping_id, sent_at) VALUES (%s, now())", (ping_id,))
    ctx.send(Pong(ping_id))


@SERVICE.step(Explode, name="test_explode")
def explode(ctx: StepContext, command: Explode) -> None:
    _record_and_send(ctx, command.ping_id)
    with _attempts_lock:
        ATTEMPTS[command.ping_id] += 1
        attempt = ATTEMPTS[command.ping_id]
    if command.times < 0 or attempt <= command.times:
        raise RuntimeError(f"boom on attempt {attempt}")


@SERVICE.step(Refuse, name="test_refuse")
def refuse(ctx: StepContext, command: Refuse) -> dict[str, str]:
    _record_and_send(ctx, command.ping_id)
    raise BusinessFailure("not enough money in account 42")
