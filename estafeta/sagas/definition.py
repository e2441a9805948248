"""What a saga kind is declared as, checked once: its steps, data class, key, table and hook.

:class:`SagaDefinition` is the part of a :class:`estafeta.sagas.saga.Saga` that every other
module of the saga engine reads (starting one, moving it on, its commands, its deadlines):
the declaration, and what a row of the saga's table means against it (the step it is at,
its state, the steps done before). It is apart so that those modules depend on it, and the
:class:`~estafeta.sagas.saga.Saga` that puts them together on them: one way.
"""

from __future__ import annotations

import typing
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import attrs
import psycopg

from estafeta.app.errors import InvalidMessage
from estafeta.messaging.messages import from_json
from estafeta.sagas.model import SagaState, SagaStep, SagaStuck, taken, uncompensated
from estafeta.steps.context import Reply
from estafeta.steps.spec import Owner, StepSpec
from estafeta_sql.sagas import KEY_TYPES, SagaRow, SagaTable


@attrs.frozen
class SagaTransition:
    """One transition of a saga, as its ``on_transition`` hook sees it (every entry of its log but ``error``)."""

    saga_id: uuid.UUID
    #: The saga's key (the value of its data's key field: an order id).
    key: Any
    #: The saga's data (an instance of its data class); ``None`` if its payload no longer decodes.
    data: Any
    #: What happened, as the saga's log names it: ``started``, ``advanced``, ``completed``,
    #: ``compensating``, ``undone``, ``compensated``, ``failed``, ``gave_up`` (the watchdog's
    #: attempts ran out on a step past the point of no return or a compensation), ``resent``
    #: or ``resumed``.
    event: str
    #: The status and step before the transition (``None`` for ``started``): the step whose
    #: answer (or absence of answer) moved the saga.
    previous_status: str | None
    previous_step: str | None
    #: The status entered, and the step the saga waits on (or ended at) now.
    status: str
    step: str
    #: The log entry's detail.
    detail: str | None
    #: The saga's ``last_error`` after the transition: why it compensates, or failed.
    error: str | None
    #: The participant's reply that made the transition; ``None`` when a start, the watchdog
    #: (a deadline) or an operator (resume, abort) did.
    reply: Reply | None = None


#: ``on_transition(conn, transition)``: called in the transaction of each saga transition.
TransitionHook = Callable[[psycopg.Connection[Any], SagaTransition], None]


class SagaDefinition:
    """A saga kind as declared: its steps, its data class and key, its table in ``service``'s schema.

    Checked when built: a declaration the engine could not follow raises ``ValueError``
    naming the saga and the step at fault. It declares nothing and writes nothing; the
    :class:`~estafeta.sagas.saga.Saga` built on it declares its orchestrator step.
    """

    #: The orchestrator step ``<service>.saga_<name>_reply`` (the :class:`~estafeta.sagas.saga.Saga` declares it).
    reply_step: StepSpec

    def __init__(
        self,
        name: str,
        *,
        service: str,
        owner: Owner,
        data: type,
        key: str,
        steps: Sequence[SagaStep],
        after_compensation: Sequence[SagaStep] = (),
        on_transition: TransitionHook | None = None,
        local_steps: bool = False,
    ) -> None:
        self.name = name
        #: Called as ``on_transition(conn, transition)`` in the transaction of every transition.
        self.on_transition = on_transition
        #: Whether commands for the saga's own service's steps run in the orchestrator's
        #: transaction instead of being sent (:func:`estafeta.sagas.moves.run_local`).
        self.local_steps = local_steps
        #: The owning service's name (its schema holds the saga's table, its outbox the commands).
        self.service = service
        self.owner = owner
        self.data = data
        self.key = key
        self.steps = tuple(steps)
        self.after_compensation = tuple(after_compensation)
        self._by_name = {s.name: s for s in (*self.steps, *self.after_compensation)}
        self._check()
        self.table = SagaTable(service, f"saga_{name}", f"saga_{name}_log", key)
        #: The SQL type of the key column, from the data class's annotation of ``key``.
        self.key_type = _key_type(data, key)

    def _check(self) -> None:
        if len(self._by_name) != len(self.steps) + len(self.after_compensation):
            raise ValueError(f"saga {self.name}: step names must be unique")
        actions = [s.action is not None for s in self.steps]
        if True not in actions or False in actions[actions.index(True) :]:
            raise ValueError(f"saga {self.name}: only leading steps may lack an action, and one must have one")
        if any(s.retriable and s.compensation for s in self.steps):
            raise ValueError(
                f"saga {self.name}: a retriable step is past the point of no return, it has no compensation"
            )
        if any(s.action is None for s in self.after_compensation):
            raise ValueError(f"saga {self.name}: steps after compensation need an action")
        if any(s.then is not None for s in self.after_compensation):
            raise ValueError(f"saga {self.name}: steps after compensation run in order, they cannot choose")
        if any(s.then is not None and s.action is None for s in self.steps):
            raise ValueError(f"saga {self.name}: a step without an action cannot choose the next one")
        names = {s.name for s in self.steps}
        for step in self.steps:
            if step.branches and step.then is None:
                raise ValueError(f"saga {self.name}: step {step.name} declares branches but no then to choose")
            if unknown := [b for b in step.branches if b is not None and (b not in names or b == step.name)]:
                raise ValueError(
                    f"saga {self.name}: step {step.name} may branch to {unknown[0]!r}, not another of its steps"
                )
        if (lacking := uncompensated(self.steps)) is not None:
            raise ValueError(
                f"saga {self.name}: step {lacking.name} has no compensation (every step needs one,"
                " R-DIST-SAGA-X2); give it one, mark it retriable, or compensation=NOTHING_TO_UNDO"
            )

    def _step(self, name: str) -> SagaStep:
        try:
            return self._by_name[name]
        except KeyError:
            why = f"saga {self.name} has no step {name!r} (renamed or removed while sagas were in flight?)"
            raise SagaStuck(why) from None

    def _state(self, row: SagaRow) -> SagaState:
        try:
            data: Any = from_json(self.data, row.payload)
        except InvalidMessage as exc:
            raise SagaStuck(f"saga {self.name} {row.saga_id}: its payload no longer decodes: {exc}") from None
        return SagaState(row.saga_id, data, row.results)

    def _done_before(self, row: SagaRow, current: SagaStep) -> list[SagaStep]:
        """The steps done before the current one, in order: the path taken (by index when nothing branches)."""
        if any(s.then for s in self.steps):
            return taken(self.steps, self._state(row))
        return list(self.steps[: self.steps.index(current)])

    @staticmethod
    def _wait(current: SagaStep, default: timedelta, attempts: int) -> timedelta:
        # Each re-send waits longer: a slow participant gets more time, not more copies.
        return (current.timeout or default) * attempts


def _key_type(data: type, key: str) -> str:
    """The SQL type of the saga table's key column: ``uuid``, ``bigint`` or ``text``."""
    if not attrs.has(data) or key not in attrs.fields_dict(data):
        raise ValueError(f"saga data {data.__name__} must be an attrs class with a {key!r} field")
    kind = typing.get_type_hints(data).get(key)
    if kind not in KEY_TYPES:
        raise ValueError(f"saga key {data.__name__}.{key} must be a UUID, an int or a str, not {kind!r}")
    return KEY_TYPES[kind]
