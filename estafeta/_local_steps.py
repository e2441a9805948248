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

from . import _outbox as outbox
from . import _step_tx as step_tx
from ._errors import BusinessFailure
from ._locks import PostgresLocks
from ._messages import to_json
from ._step_spec import StepSpec
from ._steps import StepContext

logger = logging.getLogger(__name__)


@attrs.frozen
class LocalOutcome:
    """What a saga's local step did (:func:`run_local`): its result, or its refusal."""

    ok: bool
    result: Any = None
    error: str | None = None


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
    on refusal. Any other error is raised: the parent's transaction fails with it. No inbox
    record is written: the transaction that runs the step is the one that decided to, and
    commits with it or not at all.
    """
    assert runs_local(spec, parent), f"{spec.actor_name} cannot run in {parent.service}'s transaction"
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
    ctx = StepContext(
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
    return LocalOutcome(ok=True, result=to_json(result) if attrs.has(type(result)) else result)
