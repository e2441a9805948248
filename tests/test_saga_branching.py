"""Branching sagas: a step chooses the next from its result; compensation follows the path actually taken."""

from __future__ import annotations

import uuid

import pytest

from estafeta import Runtime, Saga, SagaStep, Service
from sql import sagas

from .probe_sagas import LOAN, TYPO, Loan
from .shop import Courier


def start(runtime: Runtime, loan: Loan) -> uuid.UUID:
    with runtime.database("probe").transaction() as conn:
        return LOAN.start(conn, loan)


def ledger(conn, loan_id: uuid.UUID) -> list[tuple[str, str]]:
    rows = conn.execute("SELECT step, direction FROM probe.test_ledger WHERE loan_id = %s ORDER BY id", (loan_id,))
    return [(r[0], r[1]) for r in rows.fetchall()]


def row(conn, saga_id: uuid.UUID) -> sagas.SagaRow:
    found = sagas.get(conn, LOAN.table, saga_id)
    assert found is not None
    return found


def timeline(conn, saga_id: uuid.UUID) -> list[tuple[str, str, str]]:
    return [(e.event, e.status, e.step) for e in sagas.timeline(conn, LOAN.table, saga_id)]


@pytest.mark.parametrize(
    ("amount", "path"),
    [(800, ["approve", "disburse"]), (5_000, ["approve", "review", "disburse"])],
    ids=["approved in full", "approved in part"],
)
def test_the_approval_chooses_the_next_step(runtime: Runtime, conn, amount: int, path: list[str]) -> None:
    loan = Loan(uuid.uuid4(), amount)
    saga_id = start(runtime, loan)
    Courier(runtime, conn).run()
    assert row(conn, saga_id).status == "completed"
    assert ledger(conn, loan.loan_id) == [(step, "done") for step in path]
    assert [step for event, _, step in timeline(conn, saga_id) if event in ("started", "advanced")] == path


@pytest.mark.parametrize(
    ("amount", "undone"),
    [(800, ["approve"]), (5_000, ["review", "approve"])],
    ids=["approved in full", "approved in part"],
)
def test_compensation_follows_the_path_actually_taken(runtime: Runtime, conn, amount: int, undone: list[str]) -> None:
    loan = Loan(uuid.uuid4(), amount, refuse_disbursal=True)
    saga_id = start(runtime, loan)
    Courier(runtime, conn).run()
    finished = row(conn, saga_id)
    assert finished.status == "compensated"
    assert finished.compensations == undone  # in reverse order of the path; the refused disbursal not at all
    assert ledger(conn, loan.loan_id)[-len(undone) :] == [(step, "undone") for step in undone]


def test_a_choice_of_a_step_the_saga_does_not_have_fails_the_saga_with_the_reason(runtime: Runtime, conn) -> None:
    # The saga stops there, failed, for an operator (resume once fixed), instead of its
    # reply being retried until it is dead-lettered.
    with runtime.database("probe").transaction() as tx:
        saga_id = TYPO.start(tx, Loan(uuid.uuid4(), 800))
    Courier(runtime, conn).run()
    failed = sagas.get(conn, TYPO.table, saga_id)
    assert failed is not None and failed.status == "failed"
    assert failed.last_error == "approve: step approve chose 'disburse_now', which is not a step of the saga"


def _command(_state: object) -> object:
    return object()


@pytest.mark.parametrize(
    ("steps", "after", "message"),
    [
        ([SagaStep("a", then=lambda s: "b"), SagaStep("b", _command)], [], "a step without an action cannot choose"),
        ([SagaStep("a", _command)], [SagaStep("c", _command, then=lambda s: "a")], "steps after compensation"),
    ],
)
def test_a_malformed_branch_is_refused_when_declared(
    steps: list[SagaStep], after: list[SagaStep], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Saga("malformed", service=Service("scratch"), data=dict, key="k", steps=steps, after_compensation=after)
