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
never compensated, and failing them fails the saga for an operator instead.

Message ids are derived from the saga id, version, step, direction and attempt: the same
send always has the same id (the participant's inbox absorbs relay re-publishes and broker
redeliveries of it), while each re-send is a new message that gets a new answer even when
the answer to the previous one is stuck (a Redis worker killed with it prefetched keeps it
for a minute or more). Participants must therefore be idempotent by business key (one
payment per order), as the seeds require of every saga step; the late answer to an
earlier attempt is then just a stale reply.
"""

from __future__ import annotations

import logging
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import attrs
import psycopg
from prometheus_client import Counter

from estafeta.app.errors import BusinessFailure, InvalidMessage, require_transaction
from estafeta.messaging import outbox as outbox
from estafeta.messaging.messages import from_json, to_json
from estafeta.sagas.local_steps import run_local, runs_local
from estafeta.sagas.model import (
    ACTION,
    COMPENSATION,
    SagaError,
    SagaNotFound,
    SagaState,
    SagaStep,
    SagaStuck,
    as_timedelta,
    following,
    taken,
    uncompensated,
)
from estafeta.steps.delivery import REPLY_TO, Reply, StepContext
from estafeta.steps.spec import StepSpec
from sql import plan, saga_writes
from sql import sagas as store
from sql.migrate import Migration
from sql.sagas import KEY_TYPES, SagaRow, SagaTable

if TYPE_CHECKING:
    from estafeta.app.app import Service

logger = logging.getLogger(__name__)

#: Replies by saga and outcome: ``accepted`` moved a saga, ``stale`` changed nothing.
REPLIES = Counter("estafeta_saga_replies", "Saga replies by outcome", ["saga", "outcome"])
#: Transitions by saga and the status entered.
TRANSITIONS = Counter("estafeta_saga_transitions", "Saga transitions by status entered", ["saga", "status"])
#: Compensations done (the participant answered a compensation command), by saga and step:
#: the seed's ``saga_compensation_total``.
COMPENSATIONS = Counter("estafeta_saga_compensation", "Compensating steps done, by saga and step", ["saga", "step"])


@attrs.frozen
class SagaTransition:
    """One transition of a saga, as its ``on_transition`` hook sees it (every entry of its log but ``error``)."""

    saga_id: uuid.UUID
    #: The saga's key (the value of its data's key field: an order id).
    key: Any
    #: The saga's data (an instance of its data class); ``None`` if its payload no longer decodes.
    data: Any
    #: What happened, as the saga's log names it: ``started``, ``advanced``, ``completed``,
    #: ``compensating``, ``undone``, ``compensated``, ``failed``, ``resent`` or ``resumed``.
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


class Saga:
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
        service: Service,
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
        #: transaction instead of being sent (:meth:`_run_local`).
        self.local_steps = local_steps
        #: The owning service's name (its schema holds the saga's table, its outbox the commands).
        self.service = service.name
        self.owner = service
        self.data = data
        self.key = key
        self.steps = tuple(steps)
        self.after_compensation = tuple(after_compensation)
        self._by_name = {s.name: s for s in (*self.steps, *self.after_compensation)}
        self._check()
        self.table = SagaTable(service.name, f"saga_{name}", f"saga_{name}_log", key)
        #: The SQL type of the key column, from the data class's annotation of ``key``.
        self.key_type = _key_type(data, key)
        self.reply_step: StepSpec = service.step(Reply, name=f"saga_{name}_reply", opening=self._opening)(self.on_reply)
        service.adopt_saga(self)

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
        yield from self._record_plan(None, row, "started", f"waiting for {first.name}")
        TRANSITIONS.labels(self.name, "running").inc()
        yield from self._send_plan(row, traceparent=traceparent)
        return saga_id

    # -- the orchestrator step ------------------------------------------------------------

    def _opening(self, reply: Reply) -> plan.Statement | None:
        """The reply step's opening statement: its saga's row, locked in the step's first round trip.

        ``None`` for a reply that names another saga kind or no saga id: ``on_reply`` refuses it.
        """
        context = reply.context
        if context.get("saga") != self.name:
            return None
        try:
            saga_id = uuid.UUID(str(context["saga_id"]))
        except (KeyError, ValueError):
            return None
        return store.lock_statement(self.table, saga_id)

    def on_reply(self, ctx: StepContext, reply: Reply) -> None:
        """Handle a participant's reply: move the saga on if it answers the current command."""
        context = reply.context
        if context.get("saga") != self.name:
            raise BusinessFailure(f"a reply for saga kind {context.get('saga')!r} reached {self.reply_actor}")
        saga_id = uuid.UUID(str(context["saga_id"]))
        if ctx.opening is not None:  # locked in the step's first round trip (``_opening``)
            row = SagaRow.from_row(ctx.opening[0]) if ctx.opening else None
        else:
            row = store.lock(ctx.conn, self.table, saga_id)
        if row is None:
            raise BusinessFailure(f"no {self.name} saga {saga_id}")
        late = reply.ok and self._answers_given_up(row, context)
        if late:
            # The watchdog gave the step up for want of an answer (a partition outlasting its
            # attempts, say); this answer proves it done: the saga carries on from there.
            logger.info(
                "saga %s: %s reply to %s v%s came after its attempts ran out: taken (was %s)",
                saga_id,
                context.get("direction"),
                context.get("step"),
                context.get("version"),
                row.last_error,
            )
            saga_writes.clear_error(ctx.conn, self.table, row)  # superseded: the participant acted
        elif not self._answers_current(row, context):
            REPLIES.labels(self.name, "stale").inc()
            logger.info(
                "saga %s: %s reply to %s v%s ignored (now %s %s v%s)",
                saga_id,
                context.get("direction"),
                context.get("step"),
                context.get("version"),
                row.status,
                row.current_step,
                row.version,
            )
            return
        REPLIES.labels(self.name, "late" if late else "accepted").inc()
        self._take(ctx, row, reply, ctx.options.get("traceparent"), local=False)

    def _take(
        self, ctx: StepContext, row: SagaRow, reply: Reply, traceparent: str | None, *, local: bool, broke: bool = False
    ) -> None:
        """Move the saga of ``row`` on with ``reply``, the answer to its command (``local``: a local step's outcome).

        ``broke``: the local step raised an error, not a refusal: the saga fails at it all the same.
        """
        if reply.context["direction"] == ACTION:
            if reply.ok:
                try:
                    self._action_done(ctx.conn, row, reply, traceparent, ctx=ctx)
                except SagaStuck as exc:  # its choice of the next step is not a step: for an operator
                    self._give_up(ctx.conn, row, f"{row.current_step}: {exc}", reply=reply)
            else:
                # An earlier send of a refused command may still take effect (it waits in a
                # retry backoff): then the refused step is compensated too. A local step was
                # never sent.
                again = not local and (
                    row.attempts > 1 or store.sends(ctx.conn, self.table, row.saga_id, row.current_step) > 1
                )
                reason = f"{row.current_step}: {reply.error}"
                self._step_failed(ctx.conn, row, reason, include_current=again, reply=reply, ctx=ctx)
        elif reply.ok:
            self._compensation_done(ctx.conn, row, reply, traceparent, ctx=ctx)
        else:
            how = "failed" if broke else "refused"
            self._give_up(ctx.conn, row, f"compensation {row.current_step} {how}: {reply.error}", reply=reply)

    def awaits(self, row: SagaRow, context: Mapping[str, Any]) -> bool:
        """Whether the saga waits, now, for the answer to the command sent with this ``reply_to`` context.

        A saga failed for want of an answer to that very command still takes it (a late
        answer), so a replay of the command is not obsolete.
        """
        return self._answers_current(row, context) or self._answers_given_up(row, context)

    def _answers_current(self, row: SagaRow, context: Mapping[str, Any]) -> bool:
        direction = ACTION if row.status == "running" else COMPENSATION
        return (
            row.live
            and context.get("version") == row.version
            and context.get("step") == row.current_step
            and context.get("direction") == direction
        )

    def _answers_given_up(self, row: SagaRow, context: Mapping[str, Any]) -> bool:
        """Whether ``context`` is the command the saga failed on for want of a reply, nothing happening since.

        The watchdog fails a saga whose compensation (or whose step past the point of no
        return) got no answer after all its attempts, one version after the one it sent
        under; an answer to that very command is then late, not stale: the participant acted.
        """
        step = context.get("step")
        if row.status != "failed" or step != row.current_step or context.get("version") != row.version - 1:
            return False
        direction = ACTION if row.compensations is None else COMPENSATION
        if context.get("direction") != direction:
            return False
        gave_up = f"{step}: no reply after " if direction == ACTION else f"compensation {step}: no reply after "
        return (row.last_error or "").startswith(gave_up)

    # -- transitions ----------------------------------------------------------------------

    def _action_done(
        self,
        conn: psycopg.Connection[Any],
        row: SagaRow,
        reply: Reply,
        tp: str | None,
        *,
        ctx: StepContext | None = None,
    ) -> None:
        results = {**row.results, row.current_step: reply.result}
        current = self._step(row.current_step)
        # In a saga that branches, any step (chosen or next in the list) may be one done already.
        branching = any(s.then for s in self.steps)
        state = self._state(attrs.evolve(row, results=results)) if branching else SagaState(row.saga_id, None, results)
        step = following(self.steps, current, state)
        if step is not None and branching and step in taken(self.steps, state):
            how = "chose" if current.then else "is followed by"
            raise SagaStuck(f"step {current.name} {how} {step.name!r}, which this saga has done already")
        if step is not None:
            detail = f"{current.name} done" + (f", {step.name} chosen" if current.then else "")
            self._move(
                conn, row, "running", step.name, "advanced", detail, results=results, tp=tp, reply=reply, ctx=ctx
            )
        else:
            self._move(conn, row, "completed", row.current_step, "completed", None, results=results, reply=reply)

    def path(self, row: SagaRow) -> list[SagaStep]:
        """The steps the saga of ``row`` has done, in the order it did them (each choice made again
        from its recorded results, as the engine does); :class:`SagaStuck` if its payload no longer decodes."""
        branching = any(s.then for s in self.steps)
        return taken(self.steps, self._state(row) if branching else SagaState(row.saga_id, None, row.results))

    def _done_before(self, row: SagaRow, current: SagaStep) -> list[SagaStep]:
        """The steps done before the current one, in order: the path taken (by index when nothing branches)."""
        if any(s.then for s in self.steps):
            return taken(self.steps, self._state(row))
        return list(self.steps[: self.steps.index(current)])

    def _step_failed(
        self,
        conn: psycopg.Connection[Any],
        row: SagaRow,
        reason: str,
        *,
        include_current: bool,
        reply: Reply | None = None,
        ctx: StepContext | None = None,
    ) -> None:
        current = self._step(row.current_step)
        if current.retriable:
            self._give_up(conn, row, reason, reply=reply)
            return
        done = self._done_before(row, current) + ([current] if include_current else [])
        plan = [s.name for s in reversed(done) if s.compensation] + [s.name for s in self.after_compensation]
        status, step_name = ("compensating", plan[0]) if plan else ("compensated", row.current_step)
        self._move(conn, row, status, step_name, status, reason, compensations=plan, error=reason, reply=reply, ctx=ctx)

    def _compensation_done(
        self,
        conn: psycopg.Connection[Any],
        row: SagaRow,
        reply: Reply,
        tp: str | None,
        *,
        ctx: StepContext | None = None,
    ) -> None:
        if self._by_name[row.current_step] not in self.after_compensation:
            COMPENSATIONS.labels(self.name, row.current_step).inc()
        plan = row.compensations or []
        index = plan.index(row.current_step)
        # A step after compensation undoes nothing: it did its action (sent the cancellation notice).
        after = self._by_name[row.current_step] in self.after_compensation
        detail = f"{row.current_step} done after compensating" if after else f"{row.current_step} undone"
        if index + 1 < len(plan):
            self._move(conn, row, "compensating", plan[index + 1], "undone", detail, tp=tp, reply=reply, ctx=ctx)
        else:
            self._move(conn, row, "compensated", row.current_step, "compensated", detail, reply=reply)

    def _give_up(self, conn: psycopg.Connection[Any], row: SagaRow, reason: str, *, reply: Reply | None = None) -> None:
        logger.warning("saga %s %s failed: %s", self.name, row.saga_id, reason)
        self._move(conn, row, "failed", row.current_step, "failed", reason, error=reason, reply=reply)

    def _move(
        self,
        conn: psycopg.Connection[Any],
        row: SagaRow,
        status: str,
        step_name: str,
        event: str,
        detail: str | None,
        *,
        results: dict[str, Any] | None = None,
        compensations: list[str] | None = None,
        error: str | None = None,
        tp: str | None = None,
        reply: Reply | None = None,
        ctx: StepContext | None = None,
    ) -> None:
        """Move the saga (:func:`sql.saga_writes.transition`), record it, and send its next command.

        With ``ctx`` (the orchestrator step's) and ``local_steps``, a command for the saga's
        own service is run here instead (:meth:`_run_local`).
        """
        moved = saga_writes.transition(
            conn,
            self.table,
            row,
            status=status,
            step=step_name,
            wait=self._wait(self._step(step_name), row.step_timeout, 1),
            results=results,
            compensations=compensations,
            last_error=error,
            event=event,
            detail=detail,
        )
        self._record(conn, row, moved, event, detail, reply, logged=True)
        TRANSITIONS.labels(self.name, status).inc()
        if moved.live and ctx is not None and self.local_steps:
            self._run_local(ctx, moved, tp)
        elif moved.live:
            self._send(conn, moved, traceparent=tp)

    def _run_local(self, ctx: StepContext, row: SagaRow, tp: str | None) -> None:
        """Run the command the saga of ``row`` waits on in ``ctx``'s transaction, and move on with its outcome.

        Sent as any other instead when it is not for a step of the saga's own service that
        can run here (:func:`estafeta.sagas.local_steps.runs_local`: one whose lock, if it has one, is
        PostgreSQL's).
        """
        built = self.command_for(row)
        current, command, direction = built
        handlers = self.owner.router.handlers(type(command))
        if len(handlers) != 1 or not runs_local(handlers[0], ctx):
            self._send(ctx.conn, row, traceparent=tp, built=built)
            return
        message_id = self._message_id(row, direction)
        options: dict[str, Any] = {"saga_id": str(row.saga_id)}
        if tp:
            options["traceparent"] = tp
        done = run_local(ctx, handlers[0], command, message_id=message_id, saga_id=row.saga_id, options=options)
        context = self._context(row, current, direction)
        reply = Reply(in_reply_to=str(message_id), ok=done.ok, context=context, result=done.result, error=done.error)
        REPLIES.labels(self.name, "local").inc()
        self._take(ctx, row, reply, tp, local=True, broke=done.broke)

    # -- commands -------------------------------------------------------------------------

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

    def command_for(self, row: SagaRow) -> tuple[SagaStep, Any, str]:
        """The step, command and direction a live saga waits on; :class:`SagaStuck` if it cannot be built."""
        current = self._step(row.current_step)
        state = self._state(row)
        if row.status == "running":
            assert current.action is not None
            return current, current.action(state), ACTION
        factory = current.action if current in self.after_compensation else current.compensation
        assert factory is not None
        return current, factory(state), COMPENSATION

    def target(self, row: SagaRow) -> tuple[StepSpec, uuid.UUID]:
        """The step that handles the current command, and the message id of its latest send."""
        _, command, direction = self.command_for(row)
        handlers = self.owner.router.handlers(type(command))
        if len(handlers) != 1:
            names = ", ".join(h.actor_name for h in handlers) or "none"
            raise SagaStuck(f"saga {self.name}: {type(command).__name__} needs one step handling it, found: {names}")
        return handlers[0], self._message_id(row, direction)

    def _context(self, row: SagaRow, current: SagaStep, direction: str) -> dict[str, Any]:
        """The ``reply_to`` context a command carries, for its answer: the saga, its step, version and direction."""
        return {
            "saga": self.name,
            "saga_id": str(row.saga_id),
            "step": current.name,
            "version": row.version,
            "direction": direction,
        }

    @staticmethod
    def _message_id(row: SagaRow, direction: str) -> uuid.UUID:
        return uuid.uuid5(row.saga_id, f"{row.version}:{direction}:{row.current_step}:{row.attempts}")

    def _send(
        self,
        conn: psycopg.Connection[Any],
        row: SagaRow,
        *,
        previous: uuid.UUID | None = None,
        traceparent: str | None = None,
        built: tuple[SagaStep, Any, str] | None = None,
    ) -> None:
        # The command is built first: a saga whose command cannot be built is stuck, even
        # when its previous send is still in the outbox.
        built = built or self.command_for(row)
        if previous is not None and saga_writes.requeue_command(conn, self.service, previous):
            return  # the previous send never left the outbox: it is back in line instead
        # In a step, the command rides with the commit (outbox.held_until_commit).
        outbox.write_or_hold(conn, self._send_plan(row, traceparent=traceparent, built=built))

    def _send_plan(
        self, row: SagaRow, *, traceparent: str | None = None, built: tuple[SagaStep, Any, str] | None = None
    ) -> plan.Plan[None]:
        current, command, direction = built or self.command_for(row)
        message_id = self._message_id(row, direction)
        key = str(row.key)
        context = self._context(row, current, direction)
        reply_to = {"actor": self.reply_actor, "queue": self.service, "context": context, "ordering_key": key}
        yield from outbox.send_plan(
            command,
            service=self.service,
            router=self.owner.router,
            message_id=message_id,
            ordering_key=key,
            saga_id=row.saga_id,
            options={REPLY_TO: reply_to},
            traceparent=traceparent,
        )

    # -- deadlines and operators ----------------------------------------------------------

    def on_deadline(self, conn: psycopg.Connection[Any], row: SagaRow, parked: str | None) -> str:
        """Handle a live saga past its deadline (locked by the caller); return what was done.

        ``parked`` is the participant's dead-letter reason for the latest send, if it parked
        it: it goes into ``last_error`` when the step's attempts are spent.
        """
        current = self._step(row.current_step)
        _, _, direction = self.command_for(row)
        if row.attempts < current.max_attempts:
            wait = self._wait(current, row.step_timeout, row.attempts + 1)
            resent = saga_writes.record_resend(conn, self.table, row, wait=wait)
            detail = f"no reply by the deadline: attempt {resent.attempts} of {current.max_attempts}"
            self._record(conn, row, resent, "resent", detail)
            self._send(conn, resent, previous=self._message_id(row, direction))
            return "resent"
        why = f"no reply after {row.attempts} attempt(s)"
        if parked:
            why += f"; the last was parked: {parked}"
        if row.status == "running":
            self._step_failed(conn, row, f"{row.current_step}: {why}", include_current=True)
            return "compensating" if not current.retriable else "failed"
        self._give_up(conn, row, f"compensation {row.current_step}: {why}")
        return "failed"

    def attempts_spent(self, row: SagaRow) -> bool:
        """Whether the current command was sent as often as its step allows: its next deadline gives up on it."""
        return row.attempts >= self._step(row.current_step).max_attempts

    def resume(self, conn: psycopg.Connection[Any], saga_id: uuid.UUID) -> str:
        """Send a live saga's current command again now, or retry the step a failed saga stopped at.

        Either way the step starts over under a new version, with a full set of attempts:
        answers to earlier sends become stale.
        """
        row = self._locked(conn, saga_id)
        if row.live:
            self._move(conn, row, row.status, row.current_step, "resumed", f"{row.current_step} sent again on request")
            return "resent"
        if row.status != "failed":
            raise SagaError(f"saga {saga_id} is {row.status}: nothing to resume")
        status = "compensating" if row.compensations is not None else "running"
        self._move(conn, row, status, row.current_step, "resumed", f"retrying {row.current_step} on request")
        return "retrying"

    def abort(self, conn: psycopg.Connection[Any], saga_id: uuid.UUID, reason: str) -> None:
        """Compensate a running saga (or one that failed before compensating), current step included."""
        row = self._locked(conn, saga_id)
        if row.status not in ("running", "failed") or row.compensations is not None:
            raise SagaError(f"saga {saga_id} is {row.status}: nothing to abort")
        if self._step(row.current_step).retriable:
            raise SagaError(
                f"saga {saga_id} is past its point of no return ({row.current_step} is not compensated);"
                " resume it instead"
            )
        self._step_failed(conn, row, f"aborted: {reason}", include_current=True)

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

    def _locked(self, conn: psycopg.Connection[Any], saga_id: uuid.UUID) -> SagaRow:
        row = store.lock(conn, self.table, saga_id)
        if row is None:
            raise SagaNotFound(f"no {self.name} saga {saga_id}")
        return row

    @staticmethod
    def _wait(current: SagaStep, default: timedelta, attempts: int) -> timedelta:
        # Each re-send waits longer: a slow participant gets more time, not more copies.
        return (current.timeout or default) * attempts

    def _record(
        self,
        conn: psycopg.Connection[Any],
        before: SagaRow | None,
        after: SagaRow,
        event: str,
        detail: str | None,
        reply: Reply | None = None,
        *,
        logged: bool = False,
    ) -> None:
        """Log a transition (unless ``logged``: the store's transition did), and hand it to the ``on_transition`` hook.

        Both in the transition's transaction.
        """
        plan.run(conn, self._record_plan(before, after, event, detail, reply, logged=logged))

    def _record_plan(
        self,
        before: SagaRow | None,
        after: SagaRow,
        event: str,
        detail: str | None,
        reply: Reply | None = None,
        *,
        logged: bool = False,
    ) -> plan.Plan[None]:
        if not logged:
            yield saga_writes.log_statement(
                self.table,
                saga_id=after.saga_id,
                version=after.version,
                status=after.status,
                step=after.current_step,
                event=event,
                detail=detail,
            )
        hook = self.on_transition
        if hook is None:
            return
        try:
            data: Any = self._state(after).data
        except SagaStuck:
            data = None  # the payload no longer decodes: the saga is stuck, its hook still learns of it
        transition = SagaTransition(
            saga_id=after.saga_id,
            key=after.key,
            data=data,
            event=event,
            previous_status=None if before is None else before.status,
            previous_step=None if before is None else before.current_step,
            status=after.status,
            step=after.current_step,
            detail=detail,
            error=after.last_error,
            reply=reply,
        )
        yield plan.SyncOnly(lambda conn: hook(conn, transition), f"the on_transition hook of saga {self.name}")


def _key_type(data: type, key: str) -> str:
    """The SQL type of the saga table's key column: ``uuid``, ``bigint`` or ``text``."""
    if not attrs.has(data) or key not in attrs.fields_dict(data):
        raise ValueError(f"saga data {data.__name__} must be an attrs class with a {key!r} field")
    kind = typing.get_type_hints(data).get(key)
    if kind not in KEY_TYPES:
        raise ValueError(f"saga key {data.__name__}.{key} must be a UUID, an int or a str, not {kind!r}")
    return KEY_TYPES[kind]
