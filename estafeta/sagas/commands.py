"""A saga's commands: the one its row waits on, the step that handles it, its id, and sending it.

Apart from the moves because every way a saga goes on (a start, a reply, a deadline, an
operator's resume) ends by sending the command its row now waits on, built and
identified the same way: the same send always has the same message id, and a re-send a new one.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from estafeta.messaging import outbox as outbox
from estafeta.sagas.definition import SagaDefinition
from estafeta.sagas.model import ACTION, COMPENSATION, SagaStep, SagaStuck
from estafeta.steps.context import REPLY_TO
from estafeta.steps.spec import StepSpec
from estafeta_sql import plan, saga_writes
from estafeta_sql.sagas import SagaRow


def command_for(saga: SagaDefinition, row: SagaRow) -> tuple[SagaStep, Any, str]:
    """The step, command and direction a live saga waits on; :class:`SagaStuck` if it cannot be built."""
    current = saga._step(row.current_step)
    state = saga._state(row)
    if row.status == "running":
        assert current.action is not None
        return current, current.action(state), ACTION
    factory = current.action if current in saga.after_compensation else current.compensation
    assert factory is not None
    return current, factory(state), COMPENSATION


def target(saga: SagaDefinition, row: SagaRow) -> tuple[StepSpec, uuid.UUID]:
    """The step that handles the current command, and the message id of its latest send."""
    _, command, direction = command_for(saga, row)
    handlers = saga.owner.router.handlers(type(command))
    if len(handlers) != 1:
        names = ", ".join(h.actor_name for h in handlers) or "none"
        raise SagaStuck(f"saga {saga.name}: {type(command).__name__} needs one step handling it, found: {names}")
    return handlers[0], message_id_of(row, direction)


def reply_context(saga: SagaDefinition, row: SagaRow, current: SagaStep, direction: str) -> dict[str, Any]:
    """The ``reply_to`` context a command carries, for its answer: the saga, its step, version and direction."""
    return {
        "saga": saga.name,
        "saga_id": str(row.saga_id),
        "step": current.name,
        "version": row.version,
        "direction": direction,
    }


def message_id_of(row: SagaRow, direction: str) -> uuid.UUID:
    """The id of the current send of the command ``row`` waits on (one per version, direction, step and attempt)."""
    return uuid.uuid5(row.saga_id, f"{row.version}:{direction}:{row.current_step}:{row.attempts}")


def send(
    saga: SagaDefinition,
    conn: psycopg.Connection[Any],
    row: SagaRow,
    *,
    previous: uuid.UUID | None = None,
    traceparent: str | None = None,
    built: tuple[SagaStep, Any, str] | None = None,
) -> None:
    """Write the command ``row`` waits on to the outbox (or put its ``previous`` send, still there, back in line)."""
    # The command is built first: a saga whose command cannot be built is stuck, even
    # when its previous send is still in the outbox.
    built = built or command_for(saga, row)
    if previous is not None and saga_writes.requeue_command(conn, saga.service, previous):
        return  # the previous send never left the outbox: it is back in line instead
    # In a step, the command rides with the commit (outbox.held_until_commit).
    outbox.write_or_hold(conn, send_plan(saga, row, traceparent=traceparent, built=built))


def send_plan(
    saga: SagaDefinition,
    row: SagaRow,
    *,
    traceparent: str | None = None,
    built: tuple[SagaStep, Any, str] | None = None,
) -> plan.Plan[None]:
    """:func:`send` as a plan, without the re-queueing: the command's outbox row, its reply routed to the saga."""
    current, command, direction = built or command_for(saga, row)
    message_id = message_id_of(row, direction)
    key = str(row.key)
    context = reply_context(saga, row, current, direction)
    reply_to = {"actor": saga.reply_step.actor_name, "queue": saga.service, "context": context, "ordering_key": key}
    yield from outbox.send_plan(
        command,
        service=saga.service,
        router=saga.owner.router,
        message_id=message_id,
        ordering_key=key,
        saga_id=row.saga_id,
        options={REPLY_TO: reply_to},
        traceparent=traceparent,
    )
