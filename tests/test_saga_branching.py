"""Branching sagas: a step chooses the next from its result; compensation follows the path actually taken."""

from __future__ import annotations

import uuid

import attrs
import pytest

from estafeta import Runtime, Saga, SagaStep, Service, deliver
from estafeta_brokers.publish import to_message
from estafeta_sql import sagas
from estafeta_sql.outbox import OutboxRow

from .probe import SERVICE
from .probe_sagas import LOAN, TYPO, Loan, LoanStep
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


def _step(name: str) -> SagaStep:
    def do(state: object) -> LoanStep:
        return LoanStep(state.data.loan_id, name)  # type: ignore[attr-defined]

    def undo(state: object) -> LoanStep:
        return LoanStep(state.data.loan_id, name, undo=True)  # type: ignore[attr-defined]

    return SagaStep(name, action=do, compensation=undo)


#: a chooses c, c chooses b, and b (no choice of its own) is followed in the list by c: done already.
REVISIT = Saga(
    "revisit",
    service=SERVICE,
    data=Loan,
    key="loan_id",
    steps=[
        attrs.evolve(_step("a"), then=lambda s: "c"),
        _step("b"),
        attrs.evolve(_step("c"), then=lambda s: "b"),
    ],
)


class ProbeCourier(Courier):
    """The courier, delivering to every probe step (this module's saga's orchestrator included)."""

    def deliver(self, row: OutboxRow) -> str:
        return deliver(SERVICE.steps[row.actor_name], self.runtime, to_message(row))


def test_a_step_without_a_choice_never_leads_back_to_a_step_done_already(runtime: Runtime, conn) -> None:
    # a -> c -> b, then the list's next step after b is c, which ran already: the saga stops
    # there, failed for an operator, instead of running c's action a second time.
    loan = Loan(uuid.uuid4(), 800)
    with runtime.database("probe").transaction() as tx:
        saga_id = REVISIT.start(tx, loan)
    ProbeCourier(runtime, conn).run()
    assert ledger(conn, loan.loan_id) == [("a", "done"), ("c", "done"), ("b", "done")]
    failed = sagas.get(conn, REVISIT.table, saga_id)
    assert failed is not None and failed.status == "failed"
    assert failed.last_error == "b: step b is followed by 'c', which this saga has done already"


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


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([SagaStep("a", _command, branches=("b",)), SagaStep("b", _command)], "step a declares branches but no then"),
        (
            [SagaStep("a", _command, then=lambda s: "b", branches=("b", "z")), SagaStep("b", _command)],
            "step a may branch to 'z', not another of its steps",
        ),
    ],
)
def test_branches_that_name_no_other_step_are_refused_when_declared(steps: list[SagaStep], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Saga("malformed", service=Service("scratch"), data=dict, key="k", steps=steps)


def test_a_choice_outside_the_declared_branches_stops_the_saga_with_the_reason() -> None:
    from estafeta.sagas.model import SagaState, SagaStuck, following

    steps = [
        SagaStep("a", _command, then=lambda s: s.data["next"], branches=("b", None)),
        SagaStep("b", _command),
        SagaStep("c", _command),
    ]
    chose = [following(steps, steps[0], SagaState(uuid.uuid4(), {"next": n}, {})) for n in ("b", None)]
    assert [step.name if step else None for step in chose] == ["b", None]
    with pytest.raises(SagaStuck, match=r"step a chose 'c', which is not one of its declared branches \(b, end\)"):
        following(steps, steps[0], SagaState(uuid.uuid4(), {"next": "c"}, {}))
