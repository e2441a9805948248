"""Sagas on the probe service that exist only in the tests (their tables: ``probe.saga_*``)."""

from __future__ import annotations

import uuid

import attrs

from estafeta import Saga, SagaState, SagaStep, StepContext

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
        SagaStep("first", action=_once),
        SagaStep("second", action=lambda s: Twice(_probe_id(s))),
    ],
)
