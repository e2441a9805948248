"""Sagas on the probe service that exist only in the tests (their tables: ``probe.saga_*``)."""

from __future__ import annotations

import uuid
from typing import Any

import attrs

from estafeta import NOTHING_TO_UNDO, BusinessFailure, Saga, SagaState, SagaStep, StepContext

from .probe import SERVICE


@attrs.frozen
class Probe:
    """A probe saga's data."""

    probe_id: uuid.UUID
    #: Makes the first step's command factory raise (a bug shipped by a deploy).
    broken: bool = False


@attrs.frozen
class Once:
    """A command one probe step handles."""

    probe_id: uuid.UUID


@attrs.frozen
class Twice:
    """A command two probe steps handle: fine to publish, impossible to send to one step."""

    probe_id: uuid.UUID


@SERVICE.step(Once, name="test_once")
def once(ctx: StepContext, command: Once) -> None:
    return None


@SERVICE.step(Twice, name="test_twice_a")
def twice_a(ctx: StepContext, command: Twice) -> None:
    return None


@SERVICE.step(Twice, name="test_twice_b")
def twice_b(ctx: StepContext, command: Twice) -> None:
    return None


def _once(state: SagaState) -> Once:
    if state.data.broken:
        raise RuntimeError("the command factory of step first has a bug")
    return Once(_probe_id(state))


def _probe_id(state: SagaState) -> uuid.UUID:
    data = state.data
    assert isinstance(data, Probe)
    return data.probe_id


#: Its second step's command has two handlers (as after a deploy that added one); its
#: first step's command factory raises when the data says ``broken``.
TWICE = Saga(
    "twice",
    service=SERVICE,
    data=Probe,
    key="probe_id",
    steps=[
        SagaStep("first", action=_once, compensation=NOTHING_TO_UNDO),
        SagaStep("second", action=lambda s: Twice(_probe_id(s)), compensation=NOTHING_TO_UNDO),
    ],
)


# -- a branching saga: a loan approved in full is disbursed; approved in part, reviewed first --


@attrs.frozen
class Loan:
    """The loan saga's data."""

    loan_id: uuid.UUID
    amount: int
    #: What the approver grants at most.
    limit: int = 1_000
    #: Makes the disbursal a business failure (the treasury refuses).
    refuse_disbursal: bool = False


@attrs.frozen
class LoanStep:
    """Do (or, with ``undo``, undo) one step of a loan; the probe steps record it in ``probe.test_ledger``."""

    loan_id: uuid.UUID
    step: str
    amount: int = 0
    limit: int = 0
    refuse: bool = False
    undo: bool = False


@SERVICE.step(LoanStep, name="test_loan_step")
def loan_step(ctx: StepContext, command: LoanStep) -> dict[str, int]:
    if command.refuse and not command.undo:
        raise BusinessFailure(f"the treasury refuses to disburse loan {command.loan_id}")
    ctx.conn.execute(
        "INSERT INTO probe.test_ledger (loan_id, step, direction) VALUES (%s, %s, %s)",
        (command.loan_id, command.step, "undone" if command.undo else "done"),
    )
    return {"approved": min(command.amount, command.limit)} if command.step == "approve" else {}


def _loan(state: SagaState) -> Loan:
    data = state.data
    assert isinstance(data, Loan)
    return data


def _do(step: str) -> Any:
    def build(state: SagaState) -> LoanStep:
        loan = _loan(state)
        refuse = step == "disburse" and loan.refuse_disbursal
        return LoanStep(loan.loan_id, step, amount=loan.amount, limit=loan.limit, refuse=refuse)

    return build


def _undo(step: str) -> Any:
    return lambda state: LoanStep(_loan(state).loan_id, step, undo=True)


def _after_approval(state: SagaState) -> str:
    # The branch: the approver's answer decides the next step.
    return "disburse" if state.results["approve"]["approved"] >= _loan(state).amount else "review"


#: approve -> disburse, or approve -> review -> disburse (a partial approval is reviewed by hand).
LOAN = Saga(
    "loan",
    service=SERVICE,
    data=Loan,
    key="loan_id",
    steps=[
        SagaStep(
            "approve",
            action=_do("approve"),
            compensation=_undo("approve"),
            then=_after_approval,
            branches=("disburse", "review"),
        ),
        SagaStep("review", action=_do("review"), compensation=_undo("review")),
        SagaStep("disburse", action=_do("disburse"), compensation=_undo("disburse")),
    ],
)

#: Its approval chooses a step it does not have (a typo, or a step renamed by a deploy).
TYPO = Saga(
    "typo",
    service=SERVICE,
    data=Loan,
    key="loan_id",
    steps=[
        SagaStep("approve", action=_do("approve"), compensation=_undo("approve"), then=lambda s: "disburse_now"),
        SagaStep("disburse", action=_do("disburse"), compensation=NOTHING_TO_UNDO),
    ],
)
