"""What a saga is declared from: its steps, the state their commands are built from, its errors."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, NoReturn

import attrs

from estafeta_sql.errors import EstafetaError

#: The direction of a saga command: doing a step, or undoing it (and what follows the undoing).
ACTION = "action"
COMPENSATION = "compensation"


class SagaError(EstafetaError):
    """The saga cannot do what was asked in the state it is in."""


class SagaNotFound(SagaError):
    """No saga has this id."""


class SagaStuck(SagaError):
    """The saga cannot move on as declared now (a deploy changed its data class, its steps or its routing).

    It is failed with the reason; once the cause is fixed, ``estafeta sagas resume`` retries it.
    """


class NothingToUndo:
    """The type of :data:`NOTHING_TO_UNDO`; it has one instance."""

    def __repr__(self) -> str:
        return "NOTHING_TO_UNDO"

    def __bool__(self) -> bool:
        # Falsy, like ``None``: the engine plans compensations only for steps whose
        # compensation is truthy, so a marked step is never sent a compensation.
        return False

    def __call__(self, state: SagaState) -> NoReturn:
        raise SagaError("a step marked NOTHING_TO_UNDO has no compensation command to build")


#: A step's ``compensation`` when its action leaves nothing to undo (a notice, a check,
#: the last step whose refusal changes nothing). The seeds' rule R-DIST-SAGA-X2 pairs
#: every step with a compensation: a step that is neither ``retriable`` nor given a
#: compensation is refused when the saga is declared, so "nothing to undo" is said here,
#: on purpose, never left implicit. A marked step is never compensated.
NOTHING_TO_UNDO = NothingToUndo()


@attrs.frozen
class SagaState:
    """What a step's command factories see: the saga's data and what earlier steps answered."""

    saga_id: uuid.UUID
    #: The saga's data, an instance of the saga's data class.
    data: Any
    #: The results of the completed actions, by step name (``None`` for a step that returned nothing).
    results: Mapping[str, Any]


def as_timedelta(value: timedelta | float | None) -> timedelta | None:
    """Seconds as a timedelta (a timedelta or ``None`` as it is)."""
    return timedelta(seconds=value) if isinstance(value, int | float) else value


@attrs.frozen
class SagaStep:
    """One step of a saga: the command that does it and the command that undoes it."""

    name: str
    #: Builds the action command; ``None`` for a leading step the caller does itself in the
    #: transaction that starts the saga (placing the order).
    action: Callable[[SagaState], Any] | None = None
    #: Builds the compensation command; :data:`NOTHING_TO_UNDO` when the action leaves
    #: nothing to undo. Only a ``retriable`` step may leave it ``None`` (R-DIST-SAGA-X2).
    compensation: Callable[[SagaState], Any] | None = None
    #: Past the point of no return: never compensated; failing it fails the saga.
    retriable: bool = False
    #: Seconds (or a timedelta) to wait for a reply; ``None``: the saga's step timeout.
    timeout: timedelta | None = attrs.field(default=None, converter=as_timedelta)
    #: Sends of one command (the first and the watchdog's re-sends) before giving up on it.
    max_attempts: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    #: Chooses the step after this one once its action is done, from the saga's state (its
    #: result is in ``state.results``): a step's name, or ``None`` to complete the saga.
    #: Without it, the next step in the list follows. A step runs at most once per saga.
    then: Callable[[SagaState], str | None] | None = None
    #: The steps ``then`` may choose, by name (``None`` among them: it may complete the saga).
    #: Declared, they are drawn in the console's diagram of the saga, and a choice outside
    #: them fails the saga as a choice of a step it does not have does. Left empty, ``then``
    #: may choose any step, and the diagram can only say that it chooses.
    branches: tuple[str | None, ...] = attrs.field(default=(), converter=tuple)


def uncompensated(steps: Sequence[SagaStep]) -> SagaStep | None:
    """The first step breaking R-DIST-SAGA-X2: neither retriable nor given a compensation (or the marker)."""
    return next((s for s in steps if s.compensation is None and not s.retriable), None)


def following(steps: Sequence[SagaStep], step: SagaStep, state: SagaState) -> SagaStep | None:
    """The step after ``step`` (done) on this saga's path: its choice, or the next in the list."""
    if step.then is None:
        index = steps.index(step)
        return steps[index + 1] if index + 1 < len(steps) else None
    name = step.then(state)
    if step.branches and name not in step.branches:
        shown = ", ".join("end" if b is None else b for b in step.branches)
        raise SagaStuck(f"step {step.name} chose {name!r}, which is not one of its declared branches ({shown})")
    if name is None:
        return None
    chosen = next((s for s in steps if s.name == name), None)
    if chosen is None:
        raise SagaStuck(f"step {step.name} chose {name!r}, which is not a step of the saga")
    return chosen


def taken(steps: Sequence[SagaStep], state: SagaState) -> list[SagaStep]:
    """The steps this saga has done, in the order it did them: the path from the first step.

    Leading steps without an action were done by whoever started the saga; a step with
    an action is done once its result is recorded. Each step's choice is made again
    from the recorded results, so the path is the one actually taken.
    """
    path: list[SagaStep] = []
    step: SagaStep | None = steps[0]
    while step is not None and step not in path and (step.action is None or step.name in state.results):
        path.append(step)
        step = following(steps, step, state)
    return path
