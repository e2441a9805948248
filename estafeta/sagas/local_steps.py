"""A saga's local steps: a step of the orchestrator's own service run in the transaction of the reply that reached it.

``Saga(local_steps=True)`` runs such a step here instead of sending it its command
(:func:`run_local`); what it did comes back as a :class:`LocalOutcome`, which the saga
takes as the step's answer.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import attrs
import psycopg

from estafeta.app.errors import BusinessFailure
from estafeta.events.store import ConcurrencyConflict
from estafeta.locks.step_locks import PostgresLocks
from estafeta.messaging import outbox as outbox
from estafeta.messaging.messages import to_json
from estafeta.steps import transaction as step_tx
from estafeta.steps.context import StepContext
from estafeta.steps.spec import StepSpec
from estafeta_sql.errors import DatabaseUnavailable, LockNotAcquired, StatementFailed
from estafeta_sql.pool import is_outage

logger = logging.getLogger(__name__)


@attrs.frozen
class LocalOutcome:
    """What a saga's local step did (:func:`run_local`): its result, its refusal, or the error it broke with."""

    ok: bool
    result: Any = None
    #: The refusal's reason, or what the step raised (``broke``).
    error: str | None = None
    #: ``True``: the step raised an error of its own, not a refusal (see :func:`run_local`).
    broke: bool = False


def runs_local(spec: StepSpec, parent: StepContext) -> bool:
    """Whether ``spec`` can run in ``parent``'s transaction: the same service's, its lock (if any) PostgreSQL's."""
    if spec.service != parent.service:
        return False
    return spec.lock is None or (parent.runtime is not None and isinstance(parent.runtime.locks, PostgresLocks))


def run_local(
    parent: StepContext,
    spec: StepSpec,
    command: Any,
    *,
    message_id: uuid.UUID,
    saga_id: uuid.UUID,
    options: dict[str, Any],
) -> LocalOutcome:
    """Run ``spec``'s function on ``command`` in a savepoint of ``parent``'s transaction (a saga's local step).

    What a delivery of the command as a message would do, without the message: the step's
    lock (PostgreSQL's, taken before the savepoint, so held to the end of the parent's
    transaction, a refusal's writes included), the savepoint and its opening statement go
    in one round trip; its sends ride with the parent's commit; a :class:`BusinessFailure`
    rolls back to the savepoint, drops what the step sent and writes what it asked to write
    on refusal. No inbox record is written: the transaction that runs the step is the one
    that decided to, and commits with it or not at all.

    Any other error of the step rolls back to the savepoint too, and comes back as the
    step's outcome (``broke``, its ``error`` naming the step and the exception, logged with
    its traceback): the saga fails at this step, as when a sent step never answers, and the
    transaction of the reply that moved the saga here commits. Only what may pass on another
    try is raised, failing the parent's transaction for its message to be delivered again: a
    database outage, a serialization failure or deadlock, a lock or statement timeout
    (:func:`retried_with_the_parent`), and an error before the savepoint (taking the lock).
    """
    assert runs_local(spec, parent), f"{spec.actor_name} cannot run in {parent.service}'s transaction"
    ctx = _open(parent, spec, command, message_id=message_id, saga_id=saga_id, options=options)
    conn = parent.conn
    try:
        result = spec.fn(ctx, command)
        for hook in ctx.commit_hooks:
            hook()
    except BusinessFailure as failure:
        step_tx.roll_back_work(conn, step_tx.LOCAL_SAVEPOINT)
        outbox.drop_held(conn)
        for write in ctx.refusal_writes:
            write(conn)
        logger.info("%s: local step refused %s: %s", spec.actor_name, message_id, failure)
        return LocalOutcome(ok=False, error=str(failure))
    except Exception as exc:
        if retried_with_the_parent(exc):
            raise
        # A connection that is gone cannot go back to the savepoint: that error is raised.
        step_tx.roll_back_work(conn, step_tx.LOCAL_SAVEPOINT)
        outbox.drop_held(conn)
        logger.exception("%s: local step %s broke; its saga fails at it", spec.actor_name, message_id)
        return LocalOutcome(ok=False, error=f"{spec.actor_name} raised {_first_line(exc)}", broke=True)
    return LocalOutcome(ok=True, result=to_json(result) if attrs.has(type(result)) else result)


def retried_with_the_parent(exc: Exception) -> bool:
    """Whether a local step's ``exc`` may pass on another try: an outage, a conflict or a timeout, not the step's fault.

    Such an error fails the parent's transaction, as it fails a delivered step's, and the
    parent's message is delivered again; any other error is the step's own.
    """
    if isinstance(exc, psycopg.Error):
        return is_outage(exc) or exc.sqlstate in StatementFailed.TRANSIENT_STATES
    if isinstance(exc, StatementFailed):
        return exc.transient
    return isinstance(exc, DatabaseUnavailable | LockNotAcquired | ConcurrencyConflict)


def _open(
    parent: StepContext,
    spec: StepSpec,
    command: Any,
    *,
    message_id: uuid.UUID,
    saga_id: uuid.UUID,
    options: dict[str, Any],
) -> StepContext:
    """Take the step's lock, open its savepoint and run its opening statement (one round trip); its context."""
    conn = parent.conn
    statement = spec.opening(command) if spec.opening is not None else None
    with conn.pipeline():
        outbox.write_held(conn)  # the parent's rows so far: a refusal drops only this step's own
        if spec.lock is not None:
            # Before the savepoint, as a delivered step takes it before its own: a refusal
            # rolls back to the savepoint, and its writes and the rest of the parent's
            # transaction must run under the lock too.
            assert parent.runtime is not None and isinstance(parent.runtime.locks, PostgresLocks)
            conn.execute(*parent.runtime.locks.statement(spec.lock(command)))
        conn.execute(f"SAVEPOINT {step_tx.LOCAL_SAVEPOINT}")
        opened = step_tx.run_opening(conn, statement) if statement is not None else None
    rows = step_tx.opened_rows(opened) if opened is not None else None
    locks = parent.runtime.locks if parent.runtime is not None else None
    return StepContext(
        conn=conn,
        service=spec.service,
        message_id=message_id,
        saga_id=saga_id,
        options=options,
        payload=to_json(command),
        router=spec.router,
        lock=locks.held() if spec.lock is not None and isinstance(locks, PostgresLocks) else None,
        event_store=getattr(spec.owner, "event_store", None),
        opening=rows,
        runtime=parent.runtime,
    )


def _first_line(exc: BaseException) -> str:
    """``Type: message``, the message's first line only (a database error's goes on with its context)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
