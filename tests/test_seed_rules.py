"""Seed rules the code enforces: every saga step has a compensation (R-DIST-SAGA-X2); no event goes to no one."""

from __future__ import annotations

import uuid
from typing import Any

import attrs
import psycopg
import pytest

from estafeta import NOTHING_TO_UNDO, RoutingError, Runtime, Saga, SagaStep, Service
from examples.welcome.flow import customers


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


# -- publish() of an event no step subscribes to ------------------------------------------


@attrs.frozen
class CustomerMoved:
    """An event no step of the welcome app subscribes to."""

    customer_id: uuid.UUID


def _outbox_rows(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM customers.outbox").fetchone()
    assert row is not None
    return int(row[0])


def test_an_event_no_step_subscribes_to_is_refused_and_its_transaction_rolls_back(
    runtime: Runtime, conn: psycopg.Connection[Any]
) -> None:
    customer_id = uuid.uuid4()
    with pytest.raises(RoutingError) as refused, runtime.database("customers").transaction() as tx:
        tx.execute("INSERT INTO customers.customers (customer_id, email) VALUES (%s, 'a@example.com')", (customer_id,))
        customers.publish(tx, CustomerMoved(customer_id))
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"publish() of {__name__}.CustomerMoved by service customers: no step subscribes")
    assert "unheard_ok=True" in message
    assert _outbox_rows(conn) == 0
    assert conn.execute("SELECT count(*) FROM customers.customers").fetchone() == (0,)


def test_an_event_declared_as_possibly_unheard_writes_nothing_and_commits(
    runtime: Runtime, conn: psycopg.Connection[Any]
) -> None:
    with runtime.database("customers").transaction() as tx:
        tx.execute("INSERT INTO customers.customers (customer_id, email) VALUES (%s, 'b@example.com')", (uuid.uuid4(),))
        assert customers.publish(tx, CustomerMoved(uuid.uuid4()), unheard_ok=True) == []
    assert _outbox_rows(conn) == 0
    assert conn.execute("SELECT count(*) FROM customers.customers").fetchone() == (1,)
