"""Sending commands and publishing events through a service's outbox, inside a transaction.

Steps use ``ctx.send`` / ``ctx.publish``; code outside a step (the CLI, an HTTP handler)
joins its own transaction through the service::

    with database.transaction() as conn:
        conn.execute("INSERT INTO orders.orders ...")
        orders.send(conn, ChargePayment(...))

The message is written to ``<service>.outbox`` and commits, or rolls back, with the
caller's other changes; the relay publishes it after the commit.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar

import attrs
import psycopg

from estafeta.app.errors import RoutingError
from estafeta.messaging.messages import to_json
from estafeta.observability import tracing as tracing
from estafeta.steps.spec import Router
from estafeta_sql import outbox as store
from estafeta_sql import outbox_admin, plan

T = TypeVar("T")


@attrs.frozen
class Address:
    """Where a message goes when its type alone does not say (replies, other deployments)."""

    actor_name: str
    queue_name: str


def send(conn: psycopg.Connection[Any], command: Any, **options: Any) -> uuid.UUID:
    """Write ``command`` in ``conn``'s transaction (:func:`send_plan`); return its message id."""
    return write_or_hold(conn, send_plan(command, **options))


def publish(conn: psycopg.Connection[Any], event: Any, **options: Any) -> list[uuid.UUID]:
    """Write ``event`` for its subscribers in ``conn``'s transaction (:func:`publish_plan`); return the message ids."""
    return write_or_hold(conn, publish_plan(event, **options))


#: The outbox inserts of steps in progress, sent with their commit: by ``id()`` of the step's connection.
_held: dict[int, list[plan.Statement]] = {}
#: The steps in progress that wrote to their outbox (:func:`wrote`): ``id()`` of the step's connection.
_wrote: set[int] = set()


@contextlib.contextmanager
def held_until_commit(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Hold the outbox rows sent on ``conn`` while the block runs, for :func:`write_held` to send with the commit.

    A step's sends need no answer: each one used to cost a round trip of its own in the
    middle of the step; held, they ride in the commit's pipeline. They are built (routed,
    encoded, traced) when sent, and written in the order sent. Only the row's INSERT
    waits: :func:`cancel` and :func:`reschedule` on ``conn`` write the held rows first,
    so they find a message the step sent; SQL of the step's own reading ``<service>.outbox``
    does not see them before the commit.
    """
    _held[id(conn)] = []
    try:
        yield
    finally:
        _held.pop(id(conn), None)
        _wrote.discard(id(conn))


def wrote(conn: psycopg.Connection[Any]) -> bool:
    """Whether the step holding its rows on ``conn`` wrote to its outbox (sent, cancelled or rescheduled a message).

    Read before :func:`held_until_commit` ends. A step that did not has nothing for a relay
    to publish: ``estafeta.steps.delivery`` wakes none for it.
    """
    return id(conn) in _wrote


def write_held(conn: psycopg.Connection[Any]) -> None:
    """Execute the outbox inserts held for ``conn`` (in a pipeline: queued, not waited for), in the order sent."""
    held = _held.get(id(conn))
    if held:
        _wrote.add(id(conn))
    while held:
        plan.execute(conn, held.pop(0))


def sole_held(conn: psycopg.Connection[Any]) -> Mapping[str, Any] | None:
    """The parameters of the outbox insert held for ``conn``, if exactly one is (``estafeta.messaging.handoff``)."""
    held = _held.get(id(conn))
    if not held or len(held) != 1 or not isinstance(held[0].params, dict):
        return None
    return held[0].params


def lease_sole_held(conn: psycopg.Connection[Any], schema: str, lease: timedelta) -> None:
    """Make the one outbox insert held for ``conn`` a hand-off's leased row (``outbox.handoff_statement``)."""
    held = _held[id(conn)]
    held[0] = store.handoff_statement(schema, held[0], lease)


def drop_held(conn: psycopg.Connection[Any]) -> None:
    """Forget the outbox inserts held for ``conn``: the step's work was rolled back."""
    held = _held.get(id(conn))
    if held:
        held.clear()


def write_or_hold(conn: psycopg.Connection[Any], work: plan.Plan[T]) -> T:
    """Run ``work`` (a plan that writes outbox rows) on ``conn``, holding its inserts if a step holds them there.

    Anything else the plan yields (a statement whose answer it needs) writes the held rows
    first, so it runs after them, as it would have.
    """
    held = _held.get(id(conn))
    if held is None:
        return plan.run(conn, work)

    def on(op: Any) -> Any:
        if isinstance(op, plan.Statement) and op.fetch is plan.Fetch.NOTHING:
            held.append(op)
            return plan.Result()
        write_held(conn)
        return plan.run(conn, _one(op))

    return plan.drive(work, on)


def _one(op: Any) -> plan.Plan[Any]:
    return (yield op)


def send_plan(
    command: Any,
    *,
    service: str,
    router: Router,
    to: Address | None = None,
    delay: timedelta | float | None = None,
    at: datetime | None = None,
    ordering_key: str | None = None,
    saga_id: uuid.UUID | None = None,
    message_id: uuid.UUID | None = None,
    options: Mapping[str, Any] | None = None,
    traceparent: str | None = None,
) -> plan.Plan[uuid.UUID]:
    """Write ``command`` for the one step of ``router`` that handles its type (or for ``to``); return its message id.

    ``message_id`` makes a re-send deduplicable by the receiver's inbox; ``delay``
    (seconds or a ``timedelta``) or ``at`` (a timezone-aware instant, by the service's
    clock) holds it in the outbox until then, where :func:`cancel` and :func:`reschedule`
    find it by the returned id; rows sharing an
    ``ordering_key`` reach the broker in commit order. The row's ``traceparent`` is its
    ``create`` span's context: a child of the current span, or of ``traceparent`` when
    no span is current (see :mod:`estafeta.observability.tracing`).
    """
    if to is None:
        handlers = router.handlers(type(command))
        if len(handlers) != 1:
            names = ", ".join(h.actor_name for h in handlers) or "none"
            raise RoutingError(
                f"send() needs exactly one step handling {type(command).__name__} (found: {names});"
                " use publish() for events"
            )
        to = Address(handlers[0].actor_name, handlers[0].queue_name)
    if at is not None:
        if delay is not None:
            raise ValueError("send() takes delay= or at=, not both")
        if at.tzinfo is None:
            raise ValueError(f"send(at={at!r}): give a timezone-aware datetime (e.g. tzinfo=UTC)")
    message_id = message_id or uuid.uuid4()
    yield from _write(service, to, command, message_id, at or delay, ordering_key, saga_id, options, traceparent)
    return message_id


def publish_plan(
    event: Any,
    *,
    service: str,
    router: Router,
    ordering_key: str | None = None,
    saga_id: uuid.UUID | None = None,
    options: Mapping[str, Any] | None = None,
    traceparent: str | None = None,
    unheard_ok: bool = False,
) -> plan.Plan[list[uuid.UUID]]:
    """Write ``event`` once for every step of ``router`` subscribed to its type; return the message ids.

    Subscribers are found when the event is published, among the steps of the publishing
    service's app and the apps it includes: one row per subscriber, nothing kept for a
    subscriber declared later. An event no step subscribes to would be lost without a
    trace, so it raises :class:`RoutingError` (rolling the caller's transaction back)
    unless the publisher says it may go unheard (``unheard_ok=True``: then nothing is
    written and ``[]`` is returned).
    """
    handlers = router.handlers(type(event))
    if not handlers and not unheard_ok:
        raise RoutingError(
            f"publish() of {message_type(type(event))} by service {service}: no step subscribes to it in its app"
            " (or the apps it includes), so it would reach no one; subscribe a step there, or pass"
            " unheard_ok=True if the event may go unheard"
        )
    ids = []
    for handler in handlers:
        message_id = uuid.uuid4()
        to = Address(handler.actor_name, handler.queue_name)
        yield from _write(service, to, event, message_id, None, ordering_key, saga_id, options, traceparent)
        ids.append(message_id)
    return ids


def cancel(conn: psycopg.Connection[Any], message_id: uuid.UUID, *, service: str) -> None:
    """Take the message ``send`` returned ``message_id`` for out of ``service``'s outbox, in ``conn``'s transaction.

    Exactly one of a cancel and the relay's publish wins: a relay's claim holds the row
    until the broker confirmed it, and the cancel skips a held row instead of waiting.
    Raises :class:`~estafeta.MessageBeingPublished` when a relay is publishing it now and
    :class:`~estafeta.MessageAlreadyPublished` when it is gone (published, cancelled,
    or never sent). The caller's commit makes the cancel final.
    """
    write_held(conn)
    _wrote.add(id(conn))
    plan.run(conn, outbox_admin.cancel_plan(service, message_id))


def reschedule(conn: psycopg.Connection[Any], message_id: uuid.UUID, at: datetime, *, service: str) -> None:
    """Make the message ``message_id`` of ``service``'s outbox due at ``at`` instead, in ``conn``'s transaction.

    ``at`` is timezone-aware and read on the service's clock (``clock_now()``); a time
    already past makes it due now. Refuses as :func:`cancel` does, and with
    :class:`~estafeta.ScheduledMessageRefused` for a row whose publish failed for good.
    """
    write_held(conn)
    _wrote.add(id(conn))
    plan.run(conn, outbox_admin.reschedule_plan(service, message_id, at))


def message_type(kind: type) -> str:
    """The name an outbox row records for a message class: ``module.Class`` (``estafeta_actors.orders.Reserve``)."""
    return f"{kind.__module__}.{kind.__qualname__}"


def _write(
    service: str,
    to: Address,
    body: Any,
    message_id: uuid.UUID,
    delay: timedelta | float | datetime | None,
    ordering_key: str | None,
    saga_id: uuid.UUID | None,
    options: Mapping[str, Any] | None,
    traceparent: str | None,
) -> plan.Plan[None]:
    """The plan writing one outbox row (its ``create`` span around the write)."""
    message_options: dict[str, Any] = dict(options or {})
    if saga_id is not None:
        message_options["saga_id"] = str(saga_id)
    at = delay if isinstance(delay, datetime) else None
    if isinstance(delay, int | float):
        delay = timedelta(seconds=delay)
    # The row stores its creation context: the `create` span's, never the relay's.
    with tracing.creating(to.queue_name, to.actor_name, message_id, saga_id, traceparent) as trace_context:
        message_options.update(trace_context)
        yield store.insert_statement(
            service,
            store.OutgoingMessage(
                message_id=message_id,
                queue_name=to.queue_name,
                actor_name=to.actor_name,
                args=[to_json(body)],
                options=message_options,
                ordering_key=ordering_key,
                saga_id=saga_id,
                delay=delay if isinstance(delay, timedelta) else timedelta(0),
                at=at,
                message_type=message_type(type(body)),
            ),
        )
