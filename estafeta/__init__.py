"""estafeta: transactional outbox, idempotent inbox, sagas and fenced locks for Dramatiq on PostgreSQL.

Declare services and their steps, assemble them into an :class:`App`, and bind it::

    import estafeta

    payments = estafeta.Service("payments", migrations="migrations/payments")

    @payments.step(ChargePayment, lock=lambda c: str(c.order_id))
    def charge(ctx: estafeta.StepContext, command: ChargePayment) -> None:
        ctx.conn.execute("UPDATE payments.accounts SET ...")  # your change
        ctx.send(ReserveStock(...))                            # an outbox row, same transaction

    app = estafeta.App("shop", services=[payments, ...])
    broker = app.bind().broker   # in the module `dramatiq` imports: ESTAFETA_* settings

Importing this package (or any module under it) does nothing by itself: it reads no
environment, builds no broker and declares no actor until :meth:`App.bind` is called.
The names below are the public API; every module under ``estafeta`` is private but one,
:mod:`estafeta.eventsourcing` (the ``eventsourcing`` library's persistence module, with the
``eventsourcing`` extra), which this package never imports.
"""

from __future__ import annotations

from estafeta.app.app import App, Binding, load_app
from estafeta.app.clock import Clock
from estafeta.app.errors import BusinessFailure, InvalidMessage, NoTransaction, RoutingError, SettingsError
from estafeta.app.in_process import running
from estafeta.app.runtime import Runtime
from estafeta.app.service import Service
from estafeta.app.settings import Settings
from estafeta.events.aggregates import Aggregate, Repository, StreamNotFound, applies
from estafeta.events.event_types import EventDecodeError, EventRegistry, EventRegistryError
from estafeta.events.projections import OnBadEvent, Projection, ProjectionContext, Projector, handles
from estafeta.events.projector_run import run_projectors
from estafeta.events.store import (
    ANY,
    NO_STREAM,
    ConcurrencyConflict,
    EventMetadata,
    EventStore,
    RecordedEvent,
    StreamAppend,
)
from estafeta.idempotency.keys import (
    Idempotency,
    IdempotencyKeyInFlight,
    IdempotencyKeyInvalid,
    IdempotencyKeyMissing,
    IdempotencyKeyReused,
    IdempotentRequest,
    parse_idempotency_key,
)
from estafeta.idempotency.problem import PROBLEM_JSON, HttpResponse, Problem
from estafeta.locks.redis_lease import LockLost, LockServerUnavailable, RedisLock, Redlock, redis_lock
from estafeta.messaging.messages import from_json, to_json
from estafeta.messaging.outbox import Address, cancel, reschedule
from estafeta.messaging.relaying import build_relay
from estafeta.sagas.definition import SagaTransition
from estafeta.sagas.model import NOTHING_TO_UNDO, SagaError, SagaNotFound, SagaState, SagaStep
from estafeta.sagas.saga import Saga
from estafeta.sagas.watchdog import Watchdog
from estafeta.schedules.scheduler import Scheduler
from estafeta.schedules.spec import CatchUp, Overlap, Schedule
from estafeta.steps.context import Reply, StepContext
from estafeta.steps.delivery import deliver
from estafeta.steps.outcome import Outcome
from estafeta.steps.spec import StepSpec
from estafeta.steps.step_events import StepEvents
from estafeta_sql.errors import (
    DatabaseError,
    DatabaseRefused,
    DatabaseUnavailable,
    EstafetaError,
    LockNotAcquired,
    MessageAlreadyPublished,
    MessageBeingPublished,
    ScheduledMessageRefused,
    StaleFencingToken,
    StatementFailed,
)
from estafeta_sql.plan import Fetch, Statement

#: The version: its one source (``pyproject.toml`` reads it; ``estafeta --version`` prints it).
__version__ = "0.2.0"

__all__ = [
    "ANY",
    "NOTHING_TO_UNDO",
    "NO_STREAM",
    "PROBLEM_JSON",
    "Address",
    "Aggregate",
    "App",
    "Binding",
    "BusinessFailure",
    "CatchUp",
    "Clock",
    "ConcurrencyConflict",
    "DatabaseError",
    "DatabaseRefused",
    "DatabaseUnavailable",
    "EstafetaError",
    "EventDecodeError",
    "EventMetadata",
    "EventRegistry",
    "EventRegistryError",
    "EventStore",
    "Fetch",
    "HttpResponse",
    "Idempotency",
    "IdempotencyKeyInFlight",
    "IdempotencyKeyInvalid",
    "IdempotencyKeyMissing",
    "IdempotencyKeyReused",
    "IdempotentRequest",
    "InvalidMessage",
    "LockLost",
    "LockNotAcquired",
    "LockServerUnavailable",
    "MessageAlreadyPublished",
    "MessageBeingPublished",
    "NoTransaction",
    "OnBadEvent",
    "Outcome",
    "Overlap",
    "Problem",
    "Projection",
    "ProjectionContext",
    "Projector",
    "RecordedEvent",
    "RedisLock",
    "Redlock",
    "Reply",
    "Repository",
    "RoutingError",
    "Runtime",
    "Saga",
    "SagaError",
    "SagaNotFound",
    "SagaState",
    "SagaStep",
    "SagaTransition",
    "Schedule",
    "ScheduledMessageRefused",
    "Scheduler",
    "Service",
    "Settings",
    "SettingsError",
    "StaleFencingToken",
    "Statement",
    "StatementFailed",
    "StepContext",
    "StepEvents",
    "StepSpec",
    "StreamAppend",
    "StreamNotFound",
    "Watchdog",
    "applies",
    "build_relay",
    "cancel",
    "deliver",
    "from_json",
    "handles",
    "load_app",
    "parse_idempotency_key",
    "redis_lock",
    "reschedule",
    "run_projectors",
    "running",
    "to_json",
]
