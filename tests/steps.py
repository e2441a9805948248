"""Steps that exist only in the tests, on the probe service."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import attrs
import psycopg

from estafeta import BusinessFailure, StepContext, cancel
from estafeta_actors.pingpong import Pong
from estafeta_sql.plan import Fetch, Statement

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


@attrs.frozen
class SendThree:
    """Send three pongs, cancel the second in the same step, and read the outbox back."""

    ping_id: uuid.UUID


#: What ``probe.test_send_three`` read back: the message ids sent, the one cancelled, the rows it saw.
SENT: dict[uuid.UUID, dict[str, object]] = {}


@SERVICE.step(SendThree, name="test_send_three")
def send_three(ctx: StepContext, command: SendThree) -> None:
    sent = [ctx.send(Pong(command.ping_id), delay=3600) for _ in range(3)]
    # The sends ride with the commit; a cancel in the same step finds its message all the same.
    cancel(ctx.conn, sent[1], service="probe")
    rows = ctx.conn.execute("SELECT message_id FROM probe.outbox ORDER BY id").fetchall()
    SENT[command.ping_id] = {"sent": sent, "seen": [r[0] for r in rows]}


@attrs.frozen
class SendBeforeHandOff:
    """Send a pong, send and cancel a delayed one (its rows written before the commit), then the pong to hand off."""

    ping_id: uuid.UUID


@SERVICE.step(SendBeforeHandOff, name="test_send_before_handoff")
def send_before_handoff(ctx: StepContext, command: SendBeforeHandOff) -> None:
    ctx.send(Pong(command.ping_id))
    cancel(ctx.conn, ctx.send(Pong(command.ping_id), delay=3600), service="probe")
    ctx.send(Pong(command.ping_id))  # the step's one held message: handed off


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


@attrs.frozen
class RefuseLocked:
    """Under the lock on ``refuse:<ping_id>``, refuse for a business reason, recording the ping with the refusal."""

    ping_id: uuid.UUID


#: Called while ``probe.test_refuse_locked`` writes its refusal, by ping id: what the test looks at then.
WHILE_REFUSING: dict[uuid.UUID, Callable[[], object]] = {}


@SERVICE.step(RefuseLocked, name="test_refuse_locked", lock=lambda c: f"refuse:{c.ping_id}")
def refuse_locked(ctx: StepContext, command: RefuseLocked) -> None:
    def record(conn: psycopg.Connection[Any]) -> None:
        conn.execute("INSERT INTO probe.pings (ping_id, sent_at) VALUES (%s, now())", (command.ping_id,))
        WHILE_REFUSING.pop(command.ping_id, lambda: None)()

    ctx.on_refusal(record)
    raise BusinessFailure(f"ping {command.ping_id} refused")


@attrs.frozen
class Settle:
    """Charge an order's test account once; fails (not a refusal: retried, then parked) while it has none."""

    order_id: uuid.UUID
    amount_cents: int = 100


@SERVICE.step(Settle, name="test_settle", lock=lambda c: f"order:{c.order_id}")
def settle(ctx: StepContext, command: Settle) -> None:
    row = ctx.conn.execute(
        "SELECT charged FROM probe.test_accounts WHERE order_id = %s FOR UPDATE", (command.order_id,)
    ).fetchone()
    if row is None:
        raise LookupError(f"no account for order {command.order_id}")
    if not row[0]:
        ctx.conn.execute(
            "UPDATE probe.test_accounts SET balance_cents = balance_cents - %s, charged = true WHERE order_id = %s",
            (command.amount_cents, command.order_id),
        )
    ctx.conn.execute(
        "INSERT INTO probe.test_charges (order_id, message_id, charged, amount_cents, worker_pid)"
        " VALUES (%s, %s, %s, %s, %s)",
        (command.order_id, ctx.message_id, not row[0], command.amount_cents, os.getpid()),
    )


@attrs.frozen
class Crash:
    """Kill the worker process that runs it, with SIGKILL (as an OOM kill or a segfault would)."""

    ping_id: uuid.UUID
    #: Seconds of work before the kill: a message started beside it is in flight by then.
    after_s: float = 0.0


@SERVICE.step(Crash, name="test_crash")
def crash(ctx: StepContext, command: Crash) -> None:
    time.sleep(command.after_s)
    os.kill(os.getpid(), signal.SIGKILL)


@attrs.frozen
class Linger:
    """Record a ping and send its pong after ``seconds``: a slow message, in flight beside the others."""

    ping_id: uuid.UUID
    seconds: float


@SERVICE.step(Linger, name="test_linger")
def linger(ctx: StepContext, command: Linger) -> None:
    time.sleep(command.seconds)
    _record_and_send(ctx, command.ping_id)


@attrs.frozen
class Hold:
    """Record a ping once ``release(ping_id)`` is called (in this process): a delivery kept in flight."""

    ping_id: uuid.UUID


#: Set by ``release``; what ``probe.test_hold`` waits for, per ping id.
_RELEASED: dict[uuid.UUID, threading.Event] = {}
#: Set when a delivery of ``probe.test_hold`` has started, per ping id.
HOLDING: dict[uuid.UUID, threading.Event] = {}


def held(ping_id: uuid.UUID) -> tuple[threading.Event, threading.Event]:
    """The events of a ``Hold``: (started, released); set the second to let it finish."""
    return HOLDING.setdefault(ping_id, threading.Event()), _RELEASED.setdefault(ping_id, threading.Event())


@SERVICE.step(Hold, name="test_hold")
def hold(ctx: StepContext, command: Hold) -> None:
    started, released = held(command.ping_id)
    started.set()
    if not released.wait(timeout=60):
        raise TimeoutError(f"hold {command.ping_id} never released")
    _record_and_send(ctx, command.ping_id)


@attrs.frozen
class PassOn:
    """Send ``probe.test_explode`` a command that fails its first ``times`` attempts: a hand-off that fails."""

    ping_id: uuid.UUID
    times: int = 1


@SERVICE.step(PassOn, name="test_pass_on")
def pass_on(ctx: StepContext, command: PassOn) -> None:
    ctx.send(Explode(command.ping_id, times=command.times))


@attrs.frozen
class Peek:
    """Record what the step's opening statement gave it, beside the transaction's start as the function reads it."""

    ping_id: uuid.UUID


#: What each ``test_peek`` delivery found, by ping id.
PEEKED: dict[uuid.UUID, dict[str, object]] = {}


def _peek_opening(command: Peek) -> Statement:
    return Statement("SELECT %(id)s::uuid AS ping_id, now() AS started", {"id": command.ping_id}, Fetch.DICTS)


@SERVICE.step(Peek, name="test_peek", lock=lambda c: f"peek:{c.ping_id}", opening=_peek_opening)
def peek(ctx: StepContext, command: Peek) -> None:
    started = ctx.conn.execute("SELECT now()").fetchone()
    PEEKED[command.ping_id] = {"opening": ctx.opening, "started": started[0] if started else None}
