"""Replaying dead letters once through the outbox, each in a transaction of its own.

A replay writes the message again to the service's outbox, in one transaction with the
dead letter's new status, under a new message id (the original id is in the message's
``replay_of`` option): the inbox, which recorded the original id when it was parked,
does not swallow it, and the relay publishes it like any other row. A dead letter is
replayed once: replaying it (or its group) again does nothing. A saga command whose saga
no longer waits for it (it has compensated, failed, or moved on) is marked ``obsolete``
instead: its answer would only be stale (``estafeta sagas resume`` is the way to retry a
failed saga's step). That decision is taken holding the saga's row lock, which is kept
until the replay has committed: the saga cannot move on between the two.

One letter never stops a replay of many: a letter that cannot be replayed as it stands
(its saga reference is malformed) or whose replay fails is reported with the reason as
its outcome, left parked, and the others are replayed; only an outage (a database that
does not answer) stops the loop. The CLI (``estafeta dead-letters``) and the HTTP console
call this.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import psycopg

from estafeta.app.runtime import Runtime
from estafeta.observability import tracing as tracing
from estafeta.operations.dead_letters import DeadLetter, groups, locate
from estafeta.steps.context import REPLY_TO
from estafeta_sql import dead_letters as store
from estafeta_sql import outbox as outbox_store
from estafeta_sql import sagas as saga_store
from estafeta_sql.errors import DatabaseUnavailable

if TYPE_CHECKING:
    from estafeta.app.app import App
    from estafeta.sagas.saga import Saga
    from estafeta_sql.sagas import SagaRow

# The dead letters' log lines come from one logger, whichever module writes them: a logging
# configuration (and an operator's filter) names it.
logger = logging.getLogger("estafeta.operations.dead_letters")

#: Options Dramatiq and its brokers set while delivering: a replay starts afresh without them.
_DELIVERY_OPTIONS = frozenset({"retries", "traceback", "redis_message_id", "eta"})


class ReplayOutcome(enum.StrEnum):
    """What a replay did with one dead letter."""

    #: Written to the outbox under a new message id.
    REPLAYED = "replayed"
    #: A saga command its saga no longer waits for: marked obsolete, not sent.
    OBSOLETE = "obsolete"
    #: No step of the app handles it, its saga kind is unknown, or its saga reference is
    #: malformed: left parked.
    SKIPPED = "skipped"
    #: Replaying it raised (the reason is the outcome's detail): left parked, the others go on.
    FAILED = "failed"
    #: Resolved before (a second replay): nothing done.
    ALREADY_REPLAYED = "already replayed"
    ALREADY_OBSOLETE = "already obsolete"
    #: ``dry_run``: what a replay would do.
    WOULD_REPLAY = "would replay"
    WOULD_BE_OBSOLETE = "would be obsolete"


@attrs.frozen
class Replayed:
    """The outcome of replaying one dead letter."""

    letter: DeadLetter
    outcome: ReplayOutcome
    #: The new message id, when it was replayed.
    message_id: uuid.UUID | None = None
    #: Why it is obsolete or was skipped.
    detail: str | None = None


def replay(
    runtime: Runtime,
    app: App,
    services: Sequence[str],
    *,
    ids: Sequence[int] | None = None,
    group: str | None = None,
    dry_run: bool = False,
) -> list[Replayed]:
    """Replay dead letters of ``services``: ``ids``, or the parked ones of ``group``, or every parked one.

    Each in a transaction of its own (see the module's docstring); with ``dry_run``,
    nothing is written and the outcomes say what would be done. A letter that cannot be
    replayed is one outcome (``skipped`` or ``failed``, with the reason), never an
    exception; only :class:`DatabaseUnavailable` (an outage) stops the loop.
    """
    if ids is not None:
        chosen = [(locate(runtime, services, letter_id)[0], letter_id) for letter_id in ids]
    else:
        chosen = [(g.service, i) for g in groups(runtime, services) if group in (None, g.group) for i in g.ids]
    done = (_replay_guarded(runtime, app, service, letter_id, dry_run) for service, letter_id in chosen)
    return [outcome for outcome in done if outcome is not None]


def _replay_guarded(runtime: Runtime, app: App, service: str, letter_id: int, dry_run: bool) -> Replayed | None:
    """One letter's outcome (``None`` if it was deleted meanwhile); its own failure is its outcome."""
    with runtime.database(service).connection() as conn:
        seen = store.get(conn, service, letter_id)
    if seen is None:
        return None
    try:
        return _replay_one(runtime, app, service, seen, dry_run)
    except DatabaseUnavailable:
        raise
    except Exception as exc:  # this letter's fault, not the loop's: report it, replay the others
        why = f"{type(exc).__name__}: {exc}"
        logger.warning("dead letter %d of %s (%s) not replayed: %s", letter_id, service, seen.consumer, why)
        return Replayed(DeadLetter.of(service, seen), ReplayOutcome.FAILED, detail=why)


def _replay_one(runtime: Runtime, app: App, service: str, seen: store.DeadLetterRow, dry_run: bool) -> Replayed:
    skip = _unreplayable(app, seen)
    waiting = None if skip else _saga_of(app, seen)
    with _saga_locked(runtime, service, waiting) as (conn, saga_row):
        row = store.get(conn, service, seen.id, lock=True)
        if row is None:
            raise LookupError(f"dead letter {seen.id} of {service} was deleted during its replay")
        letter = DeadLetter.of(service, row)
        if row.status != "parked":
            return Replayed(letter, ReplayOutcome(f"already {row.status}"), row.replayed_as, row.note)
        if skip:
            return Replayed(letter, ReplayOutcome.SKIPPED, detail=skip)
        moved_on = _moved_on(waiting[0], waiting[1], saga_row, row) if waiting else None
        if moved_on:
            if not dry_run:
                store.resolve(conn, service, row.id, "obsolete", note=moved_on)
            return Replayed(
                letter, ReplayOutcome.WOULD_BE_OBSOLETE if dry_run else ReplayOutcome.OBSOLETE, None, moved_on
            )
        if dry_run:
            return Replayed(letter, ReplayOutcome.WOULD_REPLAY)
        message_id = _send_again(conn, app, service, row)
        store.resolve(conn, service, row.id, "replayed", replayed_as=message_id)
    return Replayed(
        DeadLetter.of(service, attrs.evolve(row, status="replayed", replayed_as=message_id)),
        ReplayOutcome.REPLAYED,
        message_id,
    )


@contextlib.contextmanager
def _saga_locked(
    runtime: Runtime, service: str, waiting: tuple[Saga, uuid.UUID] | None
) -> Iterator[tuple[psycopg.Connection[Any], SagaRow | None]]:
    """A transaction on ``service``'s database, holding the row lock of the saga ``waiting`` (if any) until it commits.

    The saga's row is locked first, then the letter: the obsolescence decision and the
    replay happen while no reply, watchdog or operator can move the saga on. When the
    saga lives in another database, its lock is held in a transaction there that ends
    after the replay's own commit.
    """
    database = runtime.database(service)
    if waiting is None:
        with database.transaction() as conn:
            yield conn, None
        return
    saga, saga_id = waiting
    saga_database = runtime.database(saga.service)
    with saga_database.transaction() as saga_conn:
        saga_row = saga_store.lock(saga_conn, saga.table, saga_id)
        if saga_database is database:
            yield saga_conn, saga_row
            return
        with database.transaction() as conn:
            yield conn, saga_row


def _reply_context(row: store.DeadLetterRow) -> dict[str, Any]:
    """The ``reply_to`` context of the letter's message (empty if none); ``ValueError`` if it is malformed."""
    found: Any = row.message
    path = "message"
    for key in ("options", REPLY_TO, "context"):
        if not isinstance(found, dict):
            raise ValueError(f"its {path} is not a JSON object")
        found = found.get(key) or {}
        path = key if path == "message" else f"{path}.{key}"
    if not isinstance(found, dict):
        raise ValueError(f"its {path} is not a JSON object")
    return dict(found)


def _unreplayable(app: App, row: store.DeadLetterRow) -> str | None:
    """Why the dead letter cannot be replayed through ``app`` as it stands (left parked), if it cannot."""
    if row.consumer not in app.steps:
        return f"no step {row.consumer} in app {app.name} (renamed? run with the app that has it)"
    try:
        context = _reply_context(row)
    except ValueError as exc:
        return f"malformed: {exc}"
    kind = context.get("saga")
    if kind is None:
        return None
    if kind not in {saga.name for saga in app.sagas}:
        return f"its saga kind {kind!r} is not in app {app.name}: cannot tell whether its saga still waits"
    try:
        uuid.UUID(str(context.get("saga_id")))
    except ValueError:
        return (
            f"malformed: its reply context names a {kind} saga but its saga_id {context.get('saga_id')!r}"
            " is not a saga id: cannot tell whether a saga waits for it"
        )
    return None


def _saga_of(app: App, row: store.DeadLetterRow) -> tuple[Saga, uuid.UUID] | None:
    """The saga that waited for the answer of this (replayable) letter, if a saga did."""
    context = _reply_context(row)
    if context.get("saga") is None:
        return None
    return app.saga(context["saga"]), uuid.UUID(str(context.get("saga_id")))


def _moved_on(saga: Saga, saga_id: uuid.UUID, current: SagaRow | None, row: store.DeadLetterRow) -> str | None:
    """Why a saga command is obsolete (its saga, ``current`` as locked, no longer waits for it); else ``None``."""
    context = _reply_context(row)
    if current is None:
        return f"its {saga.name} saga {saga_id} is gone"
    if saga.awaits(current, context):
        return None
    return (
        f"its {saga.name} saga {saga_id} has moved on: {current.status} at {current.current_step} v{current.version}"
        f" (this was {context.get('direction')} {context.get('step')} v{context.get('version')})"
    )


def _send_again(conn: Any, app: App, service: str, row: store.DeadLetterRow) -> uuid.UUID:
    """Write the dead letter's message to ``service``'s outbox under a new id; return it."""
    original = row.message.get("options") or {}
    options = {key: value for key, value in original.items() if key not in _DELIVERY_OPTIONS}
    options["replay_of"] = row.message_id
    saga_id = uuid.UUID(str(options["saga_id"])) if options.get("saga_id") else None
    step = app.steps[row.consumer]
    message_id = uuid.uuid4()
    # A new trace, linked to the one the message was first created in.
    with (
        tracing.replaying(f"replay {step.queue_name}", original, **{"estafeta.replay_of": row.message_id}),
        tracing.creating(step.queue_name, step.actor_name, message_id, saga_id, None) as trace_context,
    ):
        options.update(trace_context)
        outbox_store.insert(
            conn,
            service,
            outbox_store.OutgoingMessage(
                message_id=message_id,
                queue_name=step.queue_name,
                actor_name=step.actor_name,
                args=list(row.message.get("args") or []),
                kwargs=dict(row.message.get("kwargs") or {}),
                options=options,
                ordering_key=(original.get(REPLY_TO) or {}).get("ordering_key"),
                saga_id=saga_id,
            ),
        )
    return message_id
