"""Sagas: an ordered list of steps, each an action command with an optional compensation.

A :class:`Saga` is orchestrated by a step of its own service (``<service>.saga_<name>_reply``):
every participant answers a saga command with a :class:`estafeta.Reply`, and the
orchestrator handles each reply in one transaction of its own (inbox, saga row, outbox).
Everything about a saga is in its row (``<service>.saga_<name>``): the current step, the
compensation plan, what each step answered, the attempt count and the deadline, so any
process can resume it after a crash. Every transition is appended to
``<service>.saga_<name>_log``.

Guarantees:

- a reply moves the saga only if it answers the command the saga waits for now (same
  step, same version); duplicate, stale and late replies change nothing;
- a business failure compensates the completed steps, each compensation once, in reverse
  order (the refused step too if its command went out more than once: an earlier send,
  retried late, may still take effect); a step that gets no answer past its deadline is
  sent again and, once its attempts are spent, is treated as failed — and compensated
  itself too, since it may have taken effect;
- a compensation that keeps failing leaves the saga ``failed`` with ``last_error``, for an
  operator (:meth:`Saga.resume` retries it once the cause is fixed);
- an ``on_transition`` hook sees every transition in the transaction that makes it (the
  reply's, the start's, the watchdog's or the operator's), so what it writes there (events,
  a read model) commits with the transition, once: a duplicate or stale reply makes no
  transition and calls no hook, and a hook that raises rolls the transition back.

Steps marked ``retriable`` come after the point of no return (the seeds' pivot): they are
never compensated, and failing them fails the saga for an operator instead (a step or a
compensation that got no reply after all its attempts leaves the saga ``gave_up``: it may
still have been done, and its late answer moves the saga on).

Message ids are derived from the saga id, version, step, direction and attempt: the same
send always has the same id (the participant's inbox absorbs relay re-publishes and broker
redeliveries of it), while each re-send is a new message that gets a new answer even when
the answer to the previous one is stuck (a Redis worker killed with it prefetched keeps it
for a minute or more). Participants must therefore be idempotent by business key (one
payment per order), as the seeds require of every saga step; the late answer to an
earlier attempt is then just a stale reply.

This module holds :class:`Saga`, the class an app declares and calls; the engine behind it
is in the modules beside it, each a function of the saga's :class:`SagaDefinition`: the
commands (:mod:`estafeta.sagas.commands`), the replies (:mod:`estafeta.sagas.replies`), the
moves they make (:mod:`estafeta.sagas.moves`), each move's log entry and hook
(:mod:`estafeta.sagas.saga_log`), and the deadlines and operators
(:mod:`estafeta.sagas.interventions`). A saga knows the service it is declared on only as
:class:`SagaService`, so that the service's module, which lists its sagas, and this one do
not import each other.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Protocol

import psycopg

from estafeta.app.errors import require_transaction
from estafeta.messaging.messages import to_json
from estafeta.sagas import commands, interventions, replies, saga_log
from estafeta.sagas.definition import SagaDefinition, TransitionHook
from estafeta.sagas.model import SagaState, SagaStep, as_timedelta, taken
from estafeta.sagas.saga_metrics import TRANSITIONS
from estafeta.steps.context import Reply, StepContext
from estafeta.steps.spec import Owner, StepSpec
from estafeta_sql import plan, saga_writes
from estafeta_sql import sagas as store
from estafeta_sql.migrate import Migration
from estafeta_sql.sagas import SagaRow


class SagaService(Owner, Protocol):
    """The service a saga is declared on (an :class:`estafeta.Service`), as the saga sees it.

    Its name (the schema of the saga's table, the outbox of its commands), its app (the
    :attr:`router` of its commands), and what declaring the saga does on it: declare the
    orchestrator step, and record the saga among the service's.
    """

    @property
    def name(self) -> str:
        """The service's name."""

    def step(
        self, handles: type, *, name: str | None = None, opening: Callable[[Any], plan.Statement | None] | None = None
    ) -> Callable[[Callable[..., Any]], StepSpec]:
        """Declare a step of the service (:meth:`estafeta.Service.step`)."""

    def adopt_saga(self, saga: Saga) -> None:
        """Record a saga orchestrated by the service."""


class Saga(SagaDefinition):
    """A saga kind: its steps, its data class and its table in ``service``'s schema.

    Declaring it declares the orchestrator step ``<service>.saga_<name>_reply`` on
    ``service``. The table ``<service>.saga_<name>`` (with the key column ``key``) and its
    ``_log`` are created by the service's migrations (:meth:`migration`, after the
    service's own). Its commands are routed through the service's app.

    ``on_transition(conn, transition)``, if given, is called with a :class:`SagaTransition`
    on ``conn``, inside the transaction of each transition (every entry of the saga's log but
    the watchdog's ``error`` entries, which record a failed attempt and are no transition),
    after the saga row moved and before its next command is written: what it writes
    commits with the transition or not at all, and an exception rolls the transition back
    (a reply is then retried; the watchdog records it on the row and fails the saga at the
    third in a row). It must only touch the saga service's own database. (The
    watchdog's failing of a saga it cannot move as declared bypasses the saga's code,
    this hook included: the definition may be what is broken.)

    ``local_steps=True``: a command for a step of the saga's own service (the orders
    service's ``ConfirmOrder`` in an order saga that the orders service orchestrates) is not
    sent: that step runs at once, in a savepoint of the transaction of the reply that moved
    the saga to it, and the saga moves on with its result or refusal in the same
    transaction (Eventuate Tram's local steps). It saves a command, a reply and their two
    transactions; the step's effects and the saga's move commit together. Its command is
    still sent when the saga starts at it or sends it again (the watchdog, an operator's
    resume), and when its step takes a Redis lock. A local step that breaks (raises anything
    but a refusal or a transient database error) is handled as that step's failure, as a refusal is.
    """

    def __init__(
        self,
        name: str,
        *,
        service: SagaService,
        data: type,
        key: str,
        steps: Sequence[SagaStep],
        after_compensation: Sequence[SagaStep] = (),
        on_transition: TransitionHook | None = None,
        local_steps: bool = False,
    ) -> None:
        super().__init__(
            name,
            service=service.name,
            owner=service,
            data=data,
            key=key,
            steps=steps,
            after_compensation=after_compensation,
            on_transition=on_transition,
            local_steps=local_steps,
        )
        self.reply_step = service.step(Reply, name=f"saga_{name}_reply", opening=self._opening)(self.on_reply)
        service.adopt_saga(self)

    @property
    def reply_actor(self) -> str:
        """The orchestrator step's actor name."""
        return self.reply_step.actor_name

    # -- starting -----------------------------------------------------------------------

    def start(
        self,
        conn: psycopg.Connection[Any],
        data: Any,
        *,
        saga_id: uuid.UUID | None = None,
        step_timeout: timedelta | float = 30.0,
        traceparent: str | None = None,
    ) -> uuid.UUID:
        """Start a saga for ``data`` in the caller's transaction: its row, its log and its first command.

        With a ``saga_id`` that already exists, nothing happens (a retried start).
        ``step_timeout`` is kept in the row: the wait for steps that declare none. A connection
        in autocommit with no transaction open is refused (:class:`estafeta.NoTransaction`).
        """
        require_transaction(conn, "Saga.start")
        return plan.run(
            conn, self.start_plan(data, saga_id=saga_id, step_timeout=step_timeout, traceparent=traceparent)
        )

    def start_plan(
        self,
        data: Any,
        *,
        saga_id: uuid.UUID | None = None,
        step_timeout: timedelta | float = 30.0,
        traceparent: str | None = None,
    ) -> plan.Plan[uuid.UUID]:
        """:meth:`start` as a plan, for any driver (``estafeta.aio`` runs it on an async connection)."""
        saga_id = saga_id or uuid.uuid4()
        first = next(s for s in self.steps if s.action is not None)
        timeout = as_timedelta(step_timeout)
        assert timeout is not None
        inserted = yield saga_writes.insert_statement(
            self.table,
            saga_id=saga_id,
            key=getattr(data, self.key),
            step=first.name,
            payload=to_json(data),
            step_timeout=timeout,
            wait=self._wait(first, timeout, 1),
        )
        if inserted.rowcount != 1:
            return saga_id
        row = yield from store.lock_plan(self.table, saga_id)
        assert row is not None
        yield from saga_log.record_plan(self, None, row, "started", f"waiting for {first.name}")
        TRANSITIONS.labels(self.name, "running").inc()
        yield from commands.send_plan(self, row, traceparent=traceparent)
        return saga_id

    # -- the orchestrator step ------------------------------------------------------------

    def _opening(self, reply: Reply) -> plan.Statement | None:
        """The reply step's opening statement (:func:`estafeta.sagas.replies.opening`)."""
        return replies.opening(self, reply)

    def on_reply(self, ctx: StepContext, reply: Reply) -> None:
        """Handle a participant's reply: move the saga on if it answers the current command."""
        replies.on_reply(self, ctx, reply)

    def awaits(self, row: SagaRow, context: Mapping[str, Any]) -> bool:
        """Whether the saga waits, now, for the answer to the command sent with this ``reply_to`` context.

        A saga given up (``gave_up``) for want of an answer to that very command still takes
        it (a late answer), so a replay of the command is not obsolete.
        """
        return replies.awaits(row, context)

    def path(self, row: SagaRow) -> list[SagaStep]:
        """The steps the saga of ``row`` has done, in the order it did them (each choice made again
        from its recorded results, as the engine does); :class:`SagaStuck` if its payload no longer decodes."""
        branching = any(s.then for s in self.steps)
        return taken(self.steps, self._state(row) if branching else SagaState(row.saga_id, None, row.results))

    # -- commands -------------------------------------------------------------------------

    def command_for(self, row: SagaRow) -> tuple[SagaStep, Any, str]:
        """The step, command and direction a live saga waits on; :class:`SagaStuck` if it cannot be built."""
        return commands.command_for(self, row)

    def target(self, row: SagaRow) -> tuple[StepSpec, uuid.UUID]:
        """The step that handles the current command, and the message id of its latest send."""
        return commands.target(self, row)

    # -- deadlines and operators ----------------------------------------------------------

    def on_deadline(self, conn: psycopg.Connection[Any], row: SagaRow, parked: str | None) -> str:
        """Handle a live saga past its deadline (locked by the caller); return what was done.

        ``parked`` is the participant's dead-letter reason for the latest send, if it parked
        it: it goes into ``last_error`` when the step's attempts are spent.
        """
        return interventions.on_deadline(self, conn, row, parked)

    def attempts_spent(self, row: SagaRow) -> bool:
        """Whether the current command was sent as often as its step allows: its next deadline gives up on it."""
        return row.attempts >= self._step(row.current_step).max_attempts

    def resume(self, conn: psycopg.Connection[Any], saga_id: uuid.UUID) -> str:
        """Send a live saga's current command again now, or retry the step a failed or given-up saga stopped at.

        Either way the step starts over under a new version, with a full set of attempts:
        answers to earlier sends become stale.
        """
        return interventions.resume(self, conn, saga_id)

    def abort(self, conn: psycopg.Connection[Any], saga_id: uuid.UUID, reason: str) -> None:
        """Compensate a running saga (or one that failed before compensating), current step included."""
        interventions.abort(self, conn, saga_id, reason)

    def migrations(self) -> list[Migration]:
        """The migrations creating this saga's table, its log and their indexes in its service's schema."""
        return store.table_migrations(self.table, self.key_type)

    def get(self, conn: psycopg.Connection[Any], saga_id: uuid.UUID) -> SagaRow | None:
        """The saga's row as it is now (unlocked), if it exists."""
        return store.get(conn, self.table, saga_id)

    def timeline(self, conn: psycopg.Connection[Any], saga_id: uuid.UUID) -> list[store.LogEntry]:
        """Every logged transition of the saga, oldest first."""
        return store.timeline(conn, self.table, saga_id)

    def of_key(self, conn: psycopg.Connection[Any], key: Any) -> list[uuid.UUID]:
        """The sagas started for ``key`` (an order id), oldest first."""
        return store.of_key(conn, self.table, key)
