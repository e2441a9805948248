"""A saga moved by no reply: the watchdog at its deadline, and an operator (resume, abort).

At a deadline the current command is sent again, under a new message id and with a longer
wait, until its step's attempts are spent; then the step is treated as failed (and
compensated itself, since it may have taken effect), or, for a compensation or a step past
the point of no return, the saga is ``gave_up``: it waits for an operator, and a late
answer (the participant acted) still moves it on. An operator's resume starts the
current step over under a new version; an abort compensates a running saga. Apart from the
replies because these act on a saga row the caller has locked, with no answer to check.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from estafeta.sagas import commands, moves, saga_log
from estafeta.sagas.definition import SagaDefinition
from estafeta.sagas.model import SagaError, SagaNotFound
from estafeta_sql import saga_writes
from estafeta_sql import sagas as store
from estafeta_sql.sagas import GAVE_UP, SagaRow


def on_deadline(saga: SagaDefinition, conn: psycopg.Connection[Any], row: SagaRow, parked: str | None) -> str:
    """Handle a live saga past its deadline (locked by the caller); return what was done.

    ``parked`` is the participant's dead-letter reason for the latest send, if it parked
    it: it goes into ``last_error`` when the step's attempts are spent.
    """
    current = saga._step(row.current_step)
    _, _, direction = commands.command_for(saga, row)
    if row.attempts < current.max_attempts:
        wait = saga._wait(current, row.step_timeout, row.attempts + 1)
        resent = saga_writes.record_resend(conn, saga.table, row, wait=wait)
        detail = f"no reply by the deadline: attempt {resent.attempts} of {current.max_attempts}"
        saga_log.record(saga, conn, row, resent, "resent", detail)
        commands.send(saga, conn, resent, previous=commands.message_id_of(row, direction))
        return "resent"
    why = f"no reply after {row.attempts} attempt(s)"
    if parked:
        why += f"; the last was parked: {parked}"
    if row.status == "running" and not current.retriable:
        moves.step_failed(saga, conn, row, f"{row.current_step}: {why}", include_current=True)
        return "compensating"
    # Nothing to compensate instead (past the point of no return, or the compensation
    # itself): the saga stops waiting, for an operator, but not as a final failure.
    where = row.current_step if row.status == "running" else f"compensation {row.current_step}"
    moves.stop_waiting(saga, conn, row, f"{where}: {why}")
    return GAVE_UP


def resume(saga: SagaDefinition, conn: psycopg.Connection[Any], saga_id: uuid.UUID) -> str:
    """Send a live saga's current command again now, or retry the step a failed or given-up saga stopped at.

    Either way the step starts over under a new version, with a full set of attempts:
    answers to earlier sends become stale.
    """
    row = _locked(saga, conn, saga_id)
    if row.live:
        detail = f"{row.current_step} sent again on request"
        moves.move(saga, conn, row, row.status, row.current_step, "resumed", detail)
        return "resent"
    if row.status not in ("failed", GAVE_UP):
        raise SagaError(f"saga {saga_id} is {row.status}: nothing to resume")
    status = "compensating" if row.compensations is not None else "running"
    moves.move(saga, conn, row, status, row.current_step, "resumed", f"retrying {row.current_step} on request")
    return "retrying"


def abort(saga: SagaDefinition, conn: psycopg.Connection[Any], saga_id: uuid.UUID, reason: str) -> None:
    """Compensate a running saga (or one that failed before compensating), current step included."""
    row = _locked(saga, conn, saga_id)
    if row.status not in ("running", "failed", GAVE_UP) or row.compensations is not None:
        raise SagaError(f"saga {saga_id} is {row.status}: nothing to abort")
    if saga._step(row.current_step).retriable:
        raise SagaError(
            f"saga {saga_id} is past its point of no return ({row.current_step} is not compensated); resume it instead"
        )
    moves.step_failed(saga, conn, row, f"aborted: {reason}", include_current=True)


def _locked(saga: SagaDefinition, conn: psycopg.Connection[Any], saga_id: uuid.UUID) -> SagaRow:
    row = store.lock(conn, saga.table, saga_id)
    if row is None:
        raise SagaNotFound(f"no {saga.name} saga {saga_id}")
    return row
