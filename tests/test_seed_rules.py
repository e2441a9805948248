"""Seed rules the declarations enforce: every saga step has a compensation (R-DIST-SAGA-X2)."""

from __future__ import annotations

import uuid

import attrs
import pytest

from estafeta import NOTHING_TO_UNDO, Saga, SagaStep, Service


@attrs.frozen
class Checkout:
    """The saga's data."""

    order_id: uuid.UUID


def _command(_state: object) -> object:
    return object()


def _declare(*steps: SagaStep) -> Saga:
    return Saga("checkout", service=Service("scratch"), data=Checkout, key="order_id", steps=steps)


@pytest.mark.parametrize(
    "steps",
    [
        # The last step is the one a declaration most often leaves bare.
        [SagaStep("charge", _command, _command), SagaStep("ship", _command)],
        # A leading step, done by whoever starts the saga, is a step too.
        [SagaStep("place"), SagaStep("charge", _command, _command)],
    ],
)
def test_a_step_without_compensation_is_refused_when_declared(steps: list[SagaStep]) -> None:
    lacking = next(s.name for s in steps if s.compensation is None)
    with pytest.raises(ValueError) as refused:
        _declare(*steps)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"saga checkout: step {lacking} has no compensation")
    assert "NOTHING_TO_UNDO" in message


def test_nothing_to_undo_states_the_exception_and_is_never_planned() -> None:
    saga = _declare(SagaStep("charge", _command, _command), SagaStep("notify", _command, NOTHING_TO_UNDO))
    notify = saga.steps[1]
    assert notify.compensation is NOTHING_TO_UNDO
    # The engine plans compensations for the steps whose compensation is truthy.
    assert [s.name for s in saga.steps if s.compensation] == ["charge"]
    assert repr(NOTHING_TO_UNDO) == "NOTHING_TO_UNDO"


def test_a_retriable_step_needs_no_compensation() -> None:
    """Past the point of no return a step is pushed through by retries, never undone (seed 002)."""
    saga = _declare(SagaStep("charge", _command, _command), SagaStep("confirm", _command, retriable=True))
    assert saga.steps[1].compensation is None
