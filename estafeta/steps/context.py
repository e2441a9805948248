"""What a step's function is given and what it answers: :class:`StepContext` and :class:`Reply`.

Apart from the delivery that builds them: a saga, an adapter or a local step uses the
context and the answer without running a delivery.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import attrs
import psycopg

from estafeta.app.errors import RoutingError
from estafeta.app.runtime import Runtime
from estafeta.events.store import EventMetadata, EventStore
from estafeta.locks.step_locks import HeldLock
from estafeta.messaging import outbox as outbox
from estafeta.steps.spec import Router
from estafeta.steps.step_events import StepEvents

#: Message option naming where a step sends its :class:`Reply`:
#: ``{"actor": ..., "queue": ..., "context": {...}, "ordering_key": ...}``.
REPLY_TO = "reply_to"


@attrs.frozen
class Reply:
    """A step's answer to the saga (or any sender) that asked for one with ``reply_to``."""

    #: The message id of the command answered.
    in_reply_to: str
    #: ``True`` if the step did its work; ``False`` for a business failure.
    ok: bool
    #: The sender's correlation data, returned untouched (saga id, step, version).
    context: dict[str, Any]
    result: dict[str, Any] | None = None
    error: str | None = None


@attrs.define
class StepContext:
    """What a step's function gets besides its command."""

    #: The connection of the step's transaction: write your service's tables through it.
    conn: psycopg.Connection[Any]
    #: The service whose schema and outbox this transaction uses.
    service: str
    #: The id of the message being processed (the inbox key).
    message_id: uuid.UUID
    #: The saga this message belongs to, if any.
    saga_id: uuid.UUID | None
    #: The message's Dramatiq options (``traceparent``, ``saga_id``, ``reply_to``...).
    options: dict[str, Any]
    #: The command as received, fields the command class does not know included.
    payload: dict[str, Any]
    #: Routes what the step sends: the app of the step's service.
    router: Router
    #: The lock held for the step's key, if it declared one.
    lock: HeldLock | None = None
    #: What :meth:`on_refusal` asked to write if the step refuses.
    refusal_writes: list[Callable[[psycopg.Connection[Any]], object]] = attrs.field(factory=list)
    #: The service's event store, if it has one (``Service.use_events``).
    event_store: EventStore | None = None
    #: What adapters keep for this delivery, by name (``estafeta.sqlalchemy.session``'s ORM session).
    resources: dict[str, Any] = attrs.field(factory=dict)
    #: What :meth:`before_commit` asked to run once the step's function has returned.
    commit_hooks: list[Callable[[], object]] = attrs.field(factory=list)
    #: The rows of the step's ``opening`` statement, run in its first round trip (``Service.step``).
    opening: list[dict[str, Any]] | None = None
    #: The runtime the step runs with (where a saga's local step finds the lock backend).
    runtime: Runtime | None = attrs.field(default=None, repr=False)

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the step's lock (Redis locks), to store with guarded writes."""
        return self.lock.token if self.lock else None

    def on_refusal(self, write: Callable[[psycopg.Connection[Any]], object]) -> None:
        """Run ``write(conn)`` in this transaction if the step ends refusing (raises a :class:`BusinessFailure`).

        A refusal rolls back the step's own work; what ``write`` does is kept, with the
        inbox record and the refusal's answer. Record the decision there (a refused
        payment), so that any later attempt of the same business operation is refused
        too: a command sent twice must not be refused once and done once.
        """
        self.refusal_writes.append(write)

    def before_commit(self, hook: Callable[[], object]) -> None:
        """Run ``hook()`` in this transaction once the step's function has returned, before its answer and commit.

        An adapter flushes its unit of work there (an ORM session's pending changes); an
        exception rolls the step back like one raised by the step. Not run when the step
        refuses or fails.
        """
        self.commit_hooks.append(hook)

    @property
    def events(self) -> StepEvents:
        """The service's event store in this step's transaction: append, load and save aggregates.

        Events carry the message being processed (causation), the saga (correlation) and the
        trace. A :class:`ConcurrencyConflict` rolls the step back and Dramatiq retries it.
        """
        if self.event_store is None:
            raise RoutingError(f"service {self.service} has no event store: call {self.service}.use_events(registry)")
        metadata = EventMetadata(
            causation_id=str(self.message_id),
            correlation_id=str(self.saga_id) if self.saga_id else None,
            traceparent=self.options.get("traceparent"),
        )
        return StepEvents(self.conn, self.event_store, metadata)

    def send(self, command: Any, **kwargs: Any) -> uuid.UUID:
        """Send ``command`` through this service's outbox, in this transaction (see :func:`outbox.send`)."""
        kwargs.setdefault("saga_id", self.saga_id)
        kwargs.setdefault("traceparent", self.options.get("traceparent"))
        return outbox.send(self.conn, command, service=self.service, router=self.router, **kwargs)

    def publish(self, event: Any, **kwargs: Any) -> list[uuid.UUID]:
        """Publish ``event`` to every subscribed step, in this transaction (see :func:`outbox.publish`)."""
        kwargs.setdefault("saga_id", self.saga_id)
        kwargs.setdefault("traceparent", self.options.get("traceparent"))
        return outbox.publish(self.conn, event, service=self.service, router=self.router, **kwargs)
