"""What a saga is declared from: its steps, the state their commands are built from, its errors."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import attrs

from sql.errors import EstafetaError

#: The direction of a saga command: doing a step, or undoing it (and what follows the undoing).
ACTION = "action"
COMPENSATION = "compensation"


class SagaError(EstafetaError):
    """The saga cannot do what was asked in the state it is in."""


class SagaNotFound(SagaError):
    """No saga has this id."""


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
    #: Builds the compensation command; ``None``: nothing to undo.
    compensation: Callable[[SagaState], Any] | None = None
    #: Past the point of no return: never compensated; failing it fails the saga.
    retriable: bool = False
    #: Seconds (or a timedelta) to wait for a reply; ``None``: the saga's step timeout.
    timeout: timedelta | None = attrs.field(default=None, converter=as_timedelta)
    #: Sends of one command (the first and the watchdog's re-sends) before giving up on it.
    max_attempts: int = attrs.field(default=3, validator=attrs.validators.ge(1))
