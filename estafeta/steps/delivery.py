"""Steps: a Dramatiq actor whose every message is one PostgreSQL transaction (``Service.step``).

In that transaction, in this order: the inbox record (a duplicate stops here, changing
nothing and taking no lock), the lock on the step's key, the step's own change, the messages it sends
(outbox rows) and its answer to a saga. The transaction runs *inside* the actor
function, not in middleware hooks: a failed commit is a failed message, which Dramatiq
retries, never an acknowledged one.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import dramatiq
import psycopg

from estafeta.app.errors import BusinessFailure, InvalidMessage
from estafeta.app.runtime import Runtime
from estafeta.locks.step_locks import HeldLock, PostgresLocks
from estafeta.messaging import handoff as handoff
from estafeta.messaging import outbox as outbox
from estafeta.messaging.messages import from_json
from estafeta.observability import delivery as observe
from estafeta.observability import metrics as metrics
from estafeta.steps import transaction as step_tx
from estafeta.steps import worker_deaths as worker_deaths
from estafeta.steps.alone import DELIVERIES
from estafeta.steps.context import StepContext
from estafeta.steps.foreign import refusal
from estafeta.steps.outcome import Outcome
from estafeta.steps.parking import answer, is_last_attempt, park
from estafeta.steps.spec import StepSpec
from estafeta_sql.errors import LockNotAcquired
from estafeta_sql.pool import Database, translate_errors

logger = logging.getLogger(__name__)


def deliver(
    spec: StepSpec, runtime: Runtime, message: dramatiq.Message[Any], *, handoff_from: str | None = None
) -> Outcome:
    """Process one delivery of ``message`` by ``spec``; return the outcome.

    Any error other than a business failure is raised for Dramatiq to retry, except on the
    last allowed attempt, when the message is dead-lettered with the error instead. Each
    delivery is one ``process`` span (a child of the message's creation context), its log
    lines carry the actor, message id, saga id and trace id, and its outcome is counted.
    ``handoff_from``: ``message`` is a hand-off whose row waits in that schema's outbox
    (``estafeta.messaging.handoff``).
    """
    with observe.delivery(spec.actor_name, message) as seen:
        seen.outcome = _deliver(spec, runtime, message, seen, handoff_from)
    return Outcome(seen.outcome)


def _deliver(
    spec: StepSpec, runtime: Runtime, message: dramatiq.Message[Any], seen: observe.Seen, handoff_from: str | None
) -> Outcome:
    database = runtime.database(spec.service)
    raw = {"args": list(message.args), "kwargs": dict(message.kwargs), "options": dict(message.options)}
    try:
        message_id = uuid.UUID(str(message.message_id))
    except ValueError:
        return park(spec, database, None, str(message.message_id), raw, "message id is not a UUID")
    foreign = refusal(runtime, message)  # another deployment's message: never run here
    if foreign is not None:
        return park(spec, database, message_id, str(message_id), raw, foreign, logged=False)
    try:
        command, payload = _decode(spec, message)
    except InvalidMessage as exc:
        return park(spec, database, message_id, str(message_id), raw, str(exc))
    try:
        run = functools.partial(
            _run, spec, runtime, database, message, message_id, command, payload, seen, handoff_from=handoff_from
        )
        outcome = _beside_or_alone(spec, message, message_id, run)
    except _Overdelivered as over:
        reason = f"delivered {over.attempts} times without finishing (does it kill its worker?)"
        return park(spec, database, message_id, str(message_id), raw, reason)
    except worker_deaths.KilledItsWorker as killer:
        return park(spec, database, message_id, str(message_id), raw, killer.reason)
    except Exception as exc:
        seen.error = exc
        if not is_last_attempt(spec, runtime, message):
            raise
        reason = f"failed {seen.attempt} times, last: {type(exc).__name__}: {exc}"
        try:
            return park(spec, database, message_id, str(message_id), raw, reason)
        except Exception:
            logger.exception("could not dead-letter %s %s; the broker will", spec.actor_name, message_id)
            raise exc from None
    return outcome


class _Overdelivered(Exception):
    def __init__(self, attempts: int) -> None:
        super().__init__(f"delivered {attempts} times")
        self.attempts = attempts


def _decode(spec: StepSpec, message: dramatiq.Message[Any]) -> tuple[Any, dict[str, Any]]:
    if message.kwargs or len(message.args) != 1:
        raise InvalidMessage(
            f"expected one JSON object argument, got {len(message.args)} args and {len(message.kwargs)} kwargs"
        )
    payload = message.args[0]
    return from_json(spec.handles, payload), payload


def _beside_or_alone(
    spec: StepSpec, message: dramatiq.Message[Any], message_id: uuid.UUID, run: Callable[..., Outcome]
) -> Outcome:
    """``run`` the delivery beside the process's others, or alone if an earlier one died unfinished.

    A kill is counted against every message in flight in the process it kills. So a message
    whose earlier delivery died is a suspect, and runs alone (``estafeta.steps.alone``): killing
    its process then, it is counted, and a message that was only beside the killer is not.
    RabbitMQ says so up front (the ``redelivered`` flag); elsewhere the count does, having
    more deliveries than Dramatiq sent copies (``_step_tx.begin``).
    """
    if getattr(message, "redelivered", None) is not True:
        try:
            with DELIVERIES.shared():
                return run(alone=False)
        except _Suspect:
            pass
    logger.info(
        "%s: an earlier delivery of %s died unfinished: it runs alone in its process", spec.actor_name, message_id
    )
    metrics.ALONE.labels(spec.actor_name).inc()
    with DELIVERIES.alone():
        return run(alone=True)


class _Suspect(Exception):
    """A delivery that must run alone (``_step_tx.Opened.suspect``)."""


def _run(
    spec: StepSpec,
    runtime: Runtime,
    database: Database,
    message: dramatiq.Message[Any],
    message_id: uuid.UUID,
    command: Any,
    payload: dict[str, Any],
    seen: observe.Seen,
    *,
    alone: bool,
    handoff_from: str | None,
) -> Outcome:
    # A PostgreSQL lock is part of the first pipeline's inbox statement, taken only for a new
    # message; a Redis lease is taken after it, for a new message too: a duplicate never
    # waits for the lock. Either is released after the transaction has ended, whichever way.
    in_transaction_lock = spec.lock is not None and isinstance(runtime.locks, PostgresLocks)
    with (
        worker_deaths.ended_on_error(database, spec.service, spec.actor_name, message_id, uncounted=(_Suspect,)),
        contextlib.ExitStack() as after_transaction,
        runtime.step_connections(database) as conn,
        translate_errors(database.description),
        step_tx.rolled_back_on_error(conn),
    ):
        copies = int(message.options.get("retries", 0)) + 1
        uncounted = step_tx.Uncounted(this_one=True) if handoff_from else _uncounted(message)
        opened = _begin(
            spec, runtime, conn, message_id, command, in_transaction_lock, uncounted, alone, copies, handoff_from
        )
        if opened.relayed:
            conn.execute("ROLLBACK")
            return Outcome.RELAYED
        if opened.suspect:
            raise _Suspect
        seen.attempt = opened.attempts
        worker_deaths.check(opened.deaths, runtime.settings.max_worker_deaths)
        if opened.attempts > runtime.settings.max_deliveries:
            raise _Overdelivered(opened.attempts)
        if not opened.first:
            step_tx.commit(conn)
            logger.info("%s: duplicate delivery of %s absorbed", spec.actor_name, message_id)
            return Outcome.DUPLICATE
        # What the step sends rides with the commit (outbox.held_until_commit).
        after_transaction.enter_context(outbox.held_until_commit(conn))
        if in_transaction_lock:
            assert isinstance(runtime.locks, PostgresLocks)
            held: HeldLock | None = runtime.locks.held()
        else:
            held = _take_lock(spec, runtime, database, conn, command, after_transaction)
        saga_id = message.options.get("saga_id")
        ctx = StepContext(
            conn=conn,
            service=spec.service,
            message_id=message_id,
            saga_id=uuid.UUID(saga_id) if saga_id else None,
            options=dict(message.options),
            payload=payload,
            router=spec.router,
            lock=held,
            event_store=getattr(spec.owner, "event_store", None),
            opening=opened.opening,
            runtime=runtime,
        )
        try:
            result = spec.fn(ctx, command)
            for hook in ctx.commit_hooks:
                hook()
        except BusinessFailure as failure:
            # Back to the savepoint: the step's own work is undone, not the inbox record.
            step_tx.roll_back_work(conn)
            outbox.drop_held(conn)
            outcome = Outcome.FAILED
            for write in ctx.refusal_writes:
                write(conn)
            with step_tx.committing(conn):
                answer(ctx, spec, str(message_id), ok=False, error=str(failure))
                baton = handoff.prepare(runtime, database, spec.service, conn)
                outbox.write_held(conn)
                _before_commit(held, conn)
        else:
            outcome = Outcome.OK
            with step_tx.committing(conn):
                answer(ctx, spec, str(message_id), ok=True, result=result)
                baton = handoff.prepare(runtime, database, spec.service, conn)
                outbox.write_held(conn)
                _before_commit(held, conn)
        wrote = outbox.wrote(conn)
    # The one message sent may go straight on (estafeta.messaging.handoff): no relay is woken for it,
    # nor for a step that sent nothing (a saga's last transition, a step answering no one);
    # rows written before the handed-off one (a cancel wrote them early) are the relays'.
    handoff.offer(baton)
    if runtime.wakes_after_commit:
        relays = wrote and (baton is None or baton.wrote_before)
        runtime.wake_after_commit(database, spec.service, relays=relays)
    logger.debug("%s: %s processed (%s)", spec.actor_name, message_id, outcome)
    return outcome


def _begin(
    spec: StepSpec,
    runtime: Runtime,
    conn: psycopg.Connection[Any],
    message_id: uuid.UUID,
    command: Any,
    in_transaction_lock: bool,
    uncounted: step_tx.Uncounted,
    alone: bool,
    copies: int,
    handoff_from: str | None,
) -> step_tx.Opened:
    """Count the delivery and open the step's transaction (with its PostgreSQL lock); time the lock's wait.

    A duplicate takes no lock (see ``step_tx.begin``): its round trip is not a lock wait.
    The step's ``opening`` statement, if it gives one for ``command``, runs in the same round
    trip, unless the step's lock is a Redis lock.
    ``uncounted``: the deliveries no count holds (:func:`_uncounted`); ``alone`` and
    ``copies``: when the count holds a suspect back; ``handoff_from``: the outbox of a
    hand-off's row (``step_tx.begin``).
    """
    # A Redis lock is taken after this round trip: an opening run before it could lock a
    # row that the lock's holder waits for. The function reads for itself (ctx.opening None).
    opening = spec.opening(command) if spec.opening is not None and (spec.lock is None or in_transaction_lock) else None
    if not in_transaction_lock:
        timeout_ms = runtime.settings.lock_timeout_ms
        return step_tx.begin(
            conn,
            spec.service,
            spec.actor_name,
            message_id,
            None,
            lock_timeout_ms=timeout_ms,
            wake_after_commit=runtime.wakes_after_commit,
            uncounted=uncounted,
            alone=alone,
            copies=copies,
            handoff_from=handoff_from,
            opening=opening,
        )
    assert spec.lock is not None and isinstance(runtime.locks, PostgresLocks)
    started = time.perf_counter()
    try:
        key = spec.lock(command)
        opened = step_tx.begin(
            conn,
            spec.service,
            spec.actor_name,
            message_id,
            key,
            lock_timeout_ms=runtime.locks.timeout_ms,
            wake_after_commit=runtime.wakes_after_commit,
            uncounted=uncounted,
            alone=alone,
            copies=copies,
            handoff_from=handoff_from,
            opening=opening,
        )
    except psycopg.errors.LockNotAvailable:
        metrics.LOCK_TIMEOUTS.labels(spec.actor_name).inc()
        raise
    if opened.first:
        # The wait includes the pipeline's other statements: a round trip, next to any real wait.
        metrics.LOCK_WAIT.labels(spec.actor_name).observe(time.perf_counter() - started)
    return opened


def _uncounted(message: dramatiq.Message[Any]) -> step_tx.Uncounted:
    """Whether this delivery of ``message`` can go uncounted, and how many deliveries before it were not counted.

    A delivery is counted so that a message which keeps killing its worker is parked (the
    count commits before the work). A broker that marks redeliveries (RabbitMQ's
    ``redelivered`` flag, which Dramatiq's consumer keeps on the message it hands over) says
    when a copy reaches its first consumer: nothing can have died of it yet, so that delivery
    is not counted, and the redelivery that follows a kill counts it. Each of Dramatiq's
    retries is a new copy whose first delivery goes uncounted too, so the deliveries before
    this one that no count holds are the copy's retries, and its own first delivery if this
    is a redelivery. Brokers that do not mark redeliveries (Redis, Kafka, the StubBroker) count
    every delivery.
    """
    redelivered = getattr(message, "redelivered", None)
    if not isinstance(redelivered, bool):
        return step_tx.Uncounted()
    retries = int(message.options.get("retries", 0))
    return step_tx.Uncounted(this_one=not redelivered, before=retries + int(redelivered), redelivered=redelivered)


def _take_lock(
    spec: StepSpec,
    runtime: Runtime,
    database: Database,
    conn: psycopg.Connection[Any],
    command: Any,
    after_transaction: contextlib.ExitStack,
) -> HeldLock | None:
    """Take the step's lock (if it declares one) until ``after_transaction`` closes; time the wait."""
    if spec.lock is None:
        return None
    started = time.perf_counter()
    try:
        held = after_transaction.enter_context(
            runtime.locks.hold(conn, spec.lock(command), schema=spec.service, dsn=database.dsn)
        )
    except LockNotAcquired:
        metrics.LOCK_TIMEOUTS.labels(spec.actor_name).inc()
        raise
    metrics.LOCK_WAIT.labels(spec.actor_name).observe(time.perf_counter() - started)
    return held


def _before_commit(held: HeldLock | None, conn: psycopg.Connection[Any]) -> None:
    if held is not None:
        # Last statement before the commit: a fence check locks its row until then.
        held.before_commit(conn)
