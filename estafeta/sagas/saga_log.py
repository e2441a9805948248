"""Recording a saga's transition: its log entry, and its ``on_transition`` hook, in the transition's transaction.

Apart because every transition is recorded the same way whatever made it (a start, a
reply, a deadline, an operator), and the hook sees each once.
"""

from __future__ import annotations

from typing import Any

import psycopg

from estafeta.sagas.definition import SagaDefinition, SagaTransition
from estafeta.sagas.model import SagaStuck
from estafeta.steps.context import Reply
from estafeta_sql import plan, saga_writes
from estafeta_sql.sagas import SagaRow


def record(
    saga: SagaDefinition,
    conn: psycopg.Connection[Any],
    before: SagaRow | None,
    after: SagaRow,
    event: str,
    detail: str | None,
    reply: Reply | None = None,
    *,
    logged: bool = False,
) -> None:
    """Log a transition (unless ``logged``: the store's transition did), and hand it to the ``on_transition`` hook.

    Both in the transition's transaction.
    """
    plan.run(conn, record_plan(saga, before, after, event, detail, reply, logged=logged))


def record_plan(
    saga: SagaDefinition,
    before: SagaRow | None,
    after: SagaRow,
    event: str,
    detail: str | None,
    reply: Reply | None = None,
    *,
    logged: bool = False,
) -> plan.Plan[None]:
    """:func:`record` as a plan, for any driver (a start on an async connection)."""
    if not logged:
        yield saga_writes.log_statement(
            saga.table,
            saga_id=after.saga_id,
            version=after.version,
            status=after.status,
            step=after.current_step,
            event=event,
            detail=detail,
        )
    hook = saga.on_transition
    if hook is None:
        return
    try:
        data: Any = saga._state(after).data
    except SagaStuck:
        data = None  # the payload no longer decodes: the saga is stuck, its hook still learns of it
    transition = SagaTransition(
        saga_id=after.saga_id,
        key=after.key,
        data=data,
        event=event,
        previous_status=None if before is None else before.status,
        previous_step=None if before is None else before.current_step,
        status=after.status,
        step=after.current_step,
        detail=detail,
        error=after.last_error,
        reply=reply,
    )
    yield plan.SyncOnly(lambda conn: hook(conn, transition), f"the on_transition hook of saga {saga.name}")
