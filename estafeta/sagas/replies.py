"""A participant's reply reaching the saga's orchestrator step: which saga it answers, and whether it still counts.

A reply moves its saga only if it answers the command the saga waits for now (same step,
same version, same direction), or the very command the watchdog gave the saga up on for want of an
answer (a late answer: the participant acted); a duplicate, stale or late-but-superseded
reply changes nothing. Apart from the moves because this is the one door a broker's
message comes in by: the moves themselves also serve a deadline, an operator and a local step.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from estafeta.app.errors import BusinessFailure
from estafeta.sagas import moves
from estafeta.sagas.definition import SagaDefinition
from estafeta.sagas.model import ACTION, COMPENSATION
from estafeta.sagas.saga_metrics import REPLIES
from estafeta.steps.context import Reply, StepContext
from estafeta_sql import plan, saga_writes
from estafeta_sql import sagas as store
from estafeta_sql.sagas import GAVE_UP, SagaRow

logger = logging.getLogger(__name__)


def opening(saga: SagaDefinition, reply: Reply) -> plan.Statement | None:
    """The reply step's opening statement: its saga's row, locked in the step's first round trip.

    ``None`` for a reply that names another saga kind or no saga id: ``on_reply`` refuses it.
    """
    context = reply.context
    if context.get("saga") != saga.name:
        return None
    try:
        saga_id = uuid.UUID(str(context["saga_id"]))
    except (KeyError, ValueError):
        return None
    return store.lock_statement(saga.table, saga_id)


def on_reply(saga: SagaDefinition, ctx: StepContext, reply: Reply) -> None:
    """Handle a participant's reply: move the saga on if it answers the current command."""
    context = reply.context
    if context.get("saga") != saga.name:
        raise BusinessFailure(f"a reply for saga kind {context.get('saga')!r} reached {saga.reply_step.actor_name}")
    saga_id = uuid.UUID(str(context["saga_id"]))
    if ctx.opening is not None:  # locked in the step's first round trip (``opening``)
        row = SagaRow.from_row(ctx.opening[0]) if ctx.opening else None
    else:
        row = store.lock(ctx.conn, saga.table, saga_id)
    if row is None:
        raise BusinessFailure(f"no {saga.name} saga {saga_id}")
    late = reply.ok and answers_given_up(row, context)
    if late:
        # The watchdog gave the step up for want of an answer (a partition outlasting its
        # attempts, say); this answer proves it done: the saga carries on from there.
        logger.info(
            "saga %s: %s reply to %s v%s came after its attempts ran out: taken (was %s)",
            saga_id,
            context.get("direction"),
            context.get("step"),
            context.get("version"),
            row.last_error,
        )
        saga_writes.clear_error(ctx.conn, saga.table, row)  # superseded: the participant acted
    elif not answers_current(row, context):
        REPLIES.labels(saga.name, "stale").inc()
        logger.info(
            "saga %s: %s reply to %s v%s ignored (now %s %s v%s)",
            saga_id,
            context.get("direction"),
            context.get("step"),
            context.get("version"),
            row.status,
            row.current_step,
            row.version,
        )
        return
    REPLIES.labels(saga.name, "late" if late else "accepted").inc()
    moves.take(saga, ctx, row, reply, ctx.options.get("traceparent"), local=False)


def awaits(row: SagaRow, context: Mapping[str, Any]) -> bool:
    """Whether the saga waits, now, for the answer to the command sent with this ``reply_to`` context.

    A saga given up for want of an answer to that very command still takes it (a late
    answer), so a replay of the command is not obsolete.
    """
    return answers_current(row, context) or answers_given_up(row, context)


def answers_current(row: SagaRow, context: Mapping[str, Any]) -> bool:
    """Whether ``context`` is the command the live saga of ``row`` waits on now."""
    direction = ACTION if row.status == "running" else COMPENSATION
    return (
        row.live
        and context.get("version") == row.version
        and context.get("step") == row.current_step
        and context.get("direction") == direction
    )


def answers_given_up(row: SagaRow, context: Mapping[str, Any]) -> bool:
    """Whether ``context`` is the command the watchdog gave the saga up on, nothing happening since.

    The watchdog gives a saga up (``gave_up``) when its compensation, or its step past the
    point of no return, got no answer after all its attempts, one version after the one it
    sent under; an answer to that very command is then late, not stale: the participant
    acted. A ``failed`` saga takes no late answer: nothing it waits for is out.
    """
    if row.status != GAVE_UP or context.get("step") != row.current_step or context.get("version") != row.version - 1:
        return False
    return context.get("direction") == (ACTION if row.compensations is None else COMPENSATION)
