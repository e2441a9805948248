"""Moving a saga on: from the answer to its command to its next status, step and command.

An answer done advances the saga (or completes it), a refusal starts its compensation (or
fails it past the point of no return), a compensation done goes on with the next one; each
move is one transition of the saga's row, recorded, and followed by its next command, or,
with ``local_steps``, by running that command's step at once when it is the saga's own
service's (:func:`run_local`), whose outcome moves the saga again in the same transaction.
These functions call each other in that loop, which is why they live together.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import psycopg

from estafeta.sagas import commands, local_steps, saga_log
from estafeta.sagas.definition import SagaDefinition
from estafeta.sagas.model import ACTION, SagaState, SagaStuck, following, taken
from estafeta.sagas.saga_metrics import COMPENSATIONS, REPLIES, TRANSITIONS
from estafeta.steps.context import Reply, StepContext
from estafeta_sql import saga_writes
from estafeta_sql import sagas as store
from estafeta_sql.sagas import GAVE_UP, SagaRow

logger = logging.getLogger(__name__)


def take(
    saga: SagaDefinition,
    ctx: StepContext,
    row: SagaRow,
    reply: Reply,
    traceparent: str | None,
    *,
    local: bool,
    broke: bool = False,
) -> None:
    """Move the saga of ``row`` on with ``reply``, the answer to its command (``local``: a local step's outcome).

    ``broke``: the local step raised an error, not a refusal: the saga fails at it all the same.
    """
    if reply.context["direction"] == ACTION:
        if reply.ok:
            try:
                action_done(saga, ctx.conn, row, reply, traceparent, ctx=ctx)
            except SagaStuck as exc:  # its choice of the next step is not a step: for an operator
                give_up(saga, ctx.conn, row, f"{row.current_step}: {exc}", reply=reply)
        else:
            # An earlier send of a refused command may still take effect (it waits in a
            # retry backoff): then the refused step is compensated too. A local step was
            # never sent.
            again = not local and (
                row.attempts > 1 or store.sends(ctx.conn, saga.table, row.saga_id, row.current_step) > 1
            )
            reason = f"{row.current_step}: {reply.error}"
            step_failed(saga, ctx.conn, row, reason, include_current=again, reply=reply, ctx=ctx)
    elif reply.ok:
        compensation_done(saga, ctx.conn, row, reply, traceparent, ctx=ctx)
    else:
        how = "failed" if broke else "refused"
        give_up(saga, ctx.conn, row, f"compensation {row.current_step} {how}: {reply.error}", reply=reply)


def action_done(
    saga: SagaDefinition,
    conn: psycopg.Connection[Any],
    row: SagaRow,
    reply: Reply,
    tp: str | None,
    *,
    ctx: StepContext | None = None,
) -> None:
    """The current step's action is done: move to the step that follows it, or complete the saga."""
    results = {**row.results, row.current_step: reply.result}
    current = saga._step(row.current_step)
    # In a saga that branches, any step (chosen or next in the list) may be one done already.
    branching = any(s.then for s in saga.steps)
    state = saga._state(attrs.evolve(row, results=results)) if branching else SagaState(row.saga_id, None, results)
    step = following(saga.steps, current, state)
    if step is not None and branching and step in taken(saga.steps, state):
        how = "chose" if current.then else "is followed by"
        raise SagaStuck(f"step {current.name} {how} {step.name!r}, which this saga has done already")
    if step is not None:
        detail = f"{current.name} done" + (f", {step.name} chosen" if current.then else "")
        move(saga, conn, row, "running", step.name, "advanced", detail, results=results, tp=tp, reply=reply, ctx=ctx)
    else:
        move(saga, conn, row, "completed", row.current_step, "completed", None, results=results, reply=reply)


def step_failed(
    saga: SagaDefinition,
    conn: psycopg.Connection[Any],
    row: SagaRow,
    reason: str,
    *,
    include_current: bool,
    reply: Reply | None = None,
    ctx: StepContext | None = None,
) -> None:
    """The current step failed: compensate the steps done (and it, with ``include_current``), in reverse order.

    A step past the point of no return (``retriable``) fails the saga instead.
    """
    current = saga._step(row.current_step)
    if current.retriable:
        give_up(saga, conn, row, reason, reply=reply)
        return
    done = saga._done_before(row, current) + ([current] if include_current else [])
    plan = [s.name for s in reversed(done) if s.compensation] + [s.name for s in saga.after_compensation]
    status, step_name = ("compensating", plan[0]) if plan else ("compensated", row.current_step)
    move(saga, conn, row, status, step_name, status, reason, compensations=plan, error=reason, reply=reply, ctx=ctx)


def compensation_done(
    saga: SagaDefinition,
    conn: psycopg.Connection[Any],
    row: SagaRow,
    reply: Reply,
    tp: str | None,
    *,
    ctx: StepContext | None = None,
) -> None:
    """The current compensation is done: move to the next one of the plan, or end the saga compensated."""
    if saga._by_name[row.current_step] not in saga.after_compensation:
        COMPENSATIONS.labels(saga.name, row.current_step).inc()
    plan = row.compensations or []
    index = plan.index(row.current_step)
    # A step after compensation undoes nothing: it did its action (sent the cancellation notice).
    after = saga._by_name[row.current_step] in saga.after_compensation
    detail = f"{row.current_step} done after compensating" if after else f"{row.current_step} undone"
    if index + 1 < len(plan):
        move(saga, conn, row, "compensating", plan[index + 1], "undone", detail, tp=tp, reply=reply, ctx=ctx)
    else:
        move(saga, conn, row, "compensated", row.current_step, "compensated", detail, reply=reply)


def give_up(
    saga: SagaDefinition, conn: psycopg.Connection[Any], row: SagaRow, reason: str, *, reply: Reply | None = None
) -> None:
    """Fail the saga at its current step with ``reason``, for an operator."""
    logger.warning("saga %s %s failed: %s", saga.name, row.saga_id, reason)
    move(saga, conn, row, "failed", row.current_step, "failed", reason, error=reason, reply=reply)


def stop_waiting(saga: SagaDefinition, conn: psycopg.Connection[Any], row: SagaRow, reason: str) -> None:
    """Give the saga up at its current step with ``reason``: its command got no reply after all its attempts.

    Not a final failure: the saga is ``gave_up`` (no deadline, for an operator), and a late
    answer to that very command still moves it on (:func:`estafeta.sagas.replies.answers_given_up`).
    """
    logger.warning("saga %s %s given up: %s (a late answer may still move it on)", saga.name, row.saga_id, reason)
    move(saga, conn, row, GAVE_UP, row.current_step, GAVE_UP, reason, error=reason)


def move(
    saga: SagaDefinition,
    conn: psycopg.Connection[Any],
    row: SagaRow,
    status: str,
    step_name: str,
    event: str,
    detail: str | None,
    *,
    results: dict[str, Any] | None = None,
    compensations: list[str] | None = None,
    error: str | None = None,
    tp: str | None = None,
    reply: Reply | None = None,
    ctx: StepContext | None = None,
) -> None:
    """Move the saga (:func:`estafeta_sql.sagas.transition`), record it, and send its next command.

    With ``ctx`` (the orchestrator step's) and ``local_steps``, a command for the saga's
    own service is run here instead (:func:`run_local`).
    """
    moved = saga_writes.transition(
        conn,
        saga.table,
        row,
        status=status,
        step=step_name,
        wait=saga._wait(saga._step(step_name), row.step_timeout, 1),
        results=results,
        compensations=compensations,
        last_error=error,
        event=event,
        detail=detail,
    )
    saga_log.record(saga, conn, row, moved, event, detail, reply, logged=True)
    TRANSITIONS.labels(saga.name, status).inc()
    if moved.live and ctx is not None and saga.local_steps:
        run_local(saga, ctx, moved, tp)
    elif moved.live:
        commands.send(saga, conn, moved, traceparent=tp)


def run_local(saga: SagaDefinition, ctx: StepContext, row: SagaRow, tp: str | None) -> None:
    """Run the command the saga of ``row`` waits on in ``ctx``'s transaction, and move on with its outcome.

    Sent as any other instead when it is not for a step of the saga's own service that
    can run here (:func:`estafeta.sagas.local_steps.runs_local`: one whose lock, if it has one, is
    PostgreSQL's).
    """
    built = commands.command_for(saga, row)
    current, command, direction = built
    handlers = saga.owner.router.handlers(type(command))
    if len(handlers) != 1 or not local_steps.runs_local(handlers[0], ctx):
        commands.send(saga, ctx.conn, row, traceparent=tp, built=built)
        return
    message_id = commands.message_id_of(row, direction)
    options: dict[str, Any] = {"saga_id": str(row.saga_id)}
    if tp:
        options["traceparent"] = tp
    done = local_steps.run_local(ctx, handlers[0], command, message_id=message_id, saga_id=row.saga_id, options=options)
    context = commands.reply_context(saga, row, current, direction)
    reply = Reply(in_reply_to=str(message_id), ok=done.ok, context=context, result=done.result, error=done.error)
    REPLIES.labels(saga.name, "local").inc()
    take(saga, ctx, row, reply, tp, local=True, broke=done.broke)
