"""The event store of a service: append with optimistic concurrency, read streams and the log.

:class:`EventStore` works on any caller's psycopg connection and joins its transaction:
appends to several streams in one transaction commit together or not at all, and inside a
step they commit with the step's inbox row and outbox rows. Event types, schema versions
and upcasters live in :mod:`estafeta.events.event_types`.
"""

from __future__ import annotations

import contextlib
import enum
import uuid
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, Generic, TypeVar

import attrs
import psycopg
import psycopg.errors

from estafeta.events.event_types import (
    EventDecodeError,
    EventRegistry,
    EventRegistryError,
    EventType,
    InvalidEventData,
    UnknownEventType,
    UnknownSchemaVersion,
)
from estafeta_sql import event_store, plan
from estafeta_sql.errors import EstafetaError

__all__ = [
    "ANY",
    "NO_STREAM",
    "ConcurrencyConflict",
    "DuplicateEventId",
    "EventDecodeError",
    "EventMetadata",
    "EventRegistry",
    "EventRegistryError",
    "EventStore",
    "EventType",
    "Expected",
    "InvalidEventData",
    "RecordedEvent",
    "StreamAppend",
    "UnknownEventType",
    "UnknownSchemaVersion",
]

E = TypeVar("E")


class Expected(enum.Enum):
    """Expected versions that are not a number."""

    #: Append whatever the stream's version (creating it if needed).
    ANY = "any"
    #: The stream must not exist yet (same as version ``0``).
    NO_STREAM = "no stream"


ANY = Expected.ANY
NO_STREAM = Expected.NO_STREAM

#: What ``expected_version`` accepts: an exact version (``0`` = no stream yet), or a sentinel.
ExpectedVersion = int | Expected


class ConcurrencyConflict(EstafetaError):
    """The stream is not at the expected version: someone else appended first. Reload and retry.

    Inside a step it is a transient error: the step's transaction rolls back and Dramatiq
    retries the message, which then sees the new version.
    """

    def __init__(self, message: str | None = None, *, stream_id: str = "", actual: int | None = None) -> None:
        super().__init__(message)
        #: The stream that conflicted.
        self.stream_id = stream_id
        #: Its version when the conflict was seen (``None``: it does not exist).
        self.actual = actual


class DuplicateEventId(EstafetaError):
    """An event with this id is already in the store; the transaction is aborted."""


@attrs.frozen
class EventMetadata:
    """Where an event came from: the message that caused it, its saga, its trace."""

    #: The id of the message being processed when the event was appended.
    causation_id: str | None = None
    #: The saga (or other flow) the event belongs to.
    correlation_id: str | None = None
    #: The W3C trace context of the step that appended it.
    traceparent: str | None = None
    #: Anything else the caller adds (JSON values).
    extra: dict[str, Any] = attrs.field(factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The stored form: the three known keys (when set) and the extras, flat."""
        known = {"causation_id": self.causation_id, "correlation_id": self.correlation_id}
        known["traceparent"] = self.traceparent
        return {**self.extra, **{k: v for k, v in known.items() if v is not None}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EventMetadata:
        """Read back the stored form; unknown keys go to ``extra``."""
        rest = dict(data)
        return cls(
            rest.pop("causation_id", None), rest.pop("correlation_id", None), rest.pop("traceparent", None), rest
        )


@attrs.frozen
class RecordedEvent(Generic[E]):
    """An event read from (or just appended to) the store, in its current schema version."""

    #: The event, as its current class.
    event: E
    stream_id: str
    #: Its place in the stream: 1 for the first.
    version: int
    #: Its place in the global log (gaps where transactions rolled back).
    position: int
    #: The appending transaction's id: projections read in ``(tx_id, position)`` order.
    tx_id: int
    event_id: uuid.UUID
    #: The stored type name.
    type: str
    #: The schema version it was written in (the event itself is the current version).
    schema_version: int
    metadata: EventMetadata
    recorded_at: datetime


@attrs.frozen
class StreamAppend:
    """Events for one stream, for :meth:`EventStore.append_streams`."""

    stream_id: str
    events: Sequence[Any]
    expected_version: ExpectedVersion = ANY
    stream_type: str | None = None


class EventStore:
    """The event store in one service schema, with the app's event types.

    Construction checks the registry (no gap in any upcaster chain). Every method takes the
    caller's connection and joins its transaction; none commits.
    """

    def __init__(self, schema: str, registry: EventRegistry) -> None:
        registry.check()
        self.schema = schema
        self.registry = registry

    def append(
        self,
        conn: psycopg.Connection[Any],
        stream_id: str,
        events: Sequence[Any],
        *,
        expected_version: ExpectedVersion = ANY,
        stream_type: str | None = None,
        metadata: EventMetadata | None = None,
    ) -> list[RecordedEvent[Any]]:
        """Append ``events`` (attrs instances of registered types) to ``stream_id`` in ``conn``'s transaction.

        ``expected_version``: the stream's exact current version (``0`` or ``NO_STREAM``:
        it must not exist yet), or ``ANY``. A conflict raises :class:`ConcurrencyConflict`
        and writes nothing; the transaction stays usable (roll it back to retry the work).
        The stream's row stays locked until the transaction ends. ``stream_type`` defaults
        to the stream id's category, the part before its first ``-`` (``order-42``: ``order``).
        """
        plan_ = self.append_plan(
            stream_id, events, expected_version=expected_version, stream_type=stream_type, metadata=metadata
        )
        return plan.run(conn, plan_)

    def append_plan(
        self,
        stream_id: str,
        events: Sequence[Any],
        *,
        expected_version: ExpectedVersion = ANY,
        stream_type: str | None = None,
        metadata: EventMetadata | None = None,
    ) -> plan.Plan[list[RecordedEvent[Any]]]:
        """:meth:`append` as a plan, for any driver (``estafeta.aio`` runs it on an async connection)."""
        meta = (metadata or EventMetadata()).to_json()
        encoded = [self.registry.encode(event) for event in events]
        rows = [event_store.NewEvent(uuid.uuid4(), t.name, t.version, data, meta) for t, data in encoded]
        expected = _expected_number(expected_version)
        kind = stream_type or stream_id.split("-", 1)[0]
        statement = event_store.append_statement(self.schema, stream_id, rows, expected=expected, stream_type=kind)
        with _translate_conflicts(stream_id):
            appended = event_store.appended((yield statement))
        if appended is None:
            state = yield from event_store.stream_state_plan(self.schema, stream_id)
            raise self._conflict(state, stream_id, expected)
        return [
            RecordedEvent(
                event,
                stream_id,
                a.version,
                a.position,
                a.tx_id,
                row.event_id,
                row.type,
                row.schema_version,
                EventMetadata.from_json(meta),
                a.recorded_at,
            )
            for event, row, a in zip(events, rows, appended, strict=True)
        ]

    def append_streams(
        self, conn: psycopg.Connection[Any], appends: Iterable[StreamAppend], *, metadata: EventMetadata | None = None
    ) -> list[RecordedEvent[Any]]:
        """Append to several streams in ``conn``'s transaction, in stream-id order (so two such calls never deadlock).

        They commit together or not at all; the first conflict raises.
        """
        recorded: list[RecordedEvent[Any]] = []
        for item in sorted(appends, key=lambda a: a.stream_id):
            recorded += self.append(
                conn,
                item.stream_id,
                item.events,
                expected_version=item.expected_version,
                stream_type=item.stream_type,
                metadata=metadata,
            )
        return recorded

    def version(self, conn: psycopg.Connection[Any], stream_id: str) -> int:
        """The stream's current version; 0 if it does not exist."""
        state = event_store.stream_state(conn, self.schema, stream_id)
        return 0 if state is None else state.version

    def read(
        self,
        conn: psycopg.Connection[Any],
        stream_id: str,
        *,
        after_version: int = 0,
        up_to_version: int | None = None,
        as_of: datetime | None = None,
        up_to_position: int | None = None,
    ) -> list[RecordedEvent[Any]]:
        """The stream's events in version order, optionally as of a version, a time or a global position.

        Raises :class:`EventDecodeError` (naming the position) for an event that cannot be read.
        """
        stored = event_store.read_stream(
            conn,
            self.schema,
            stream_id,
            after_version=after_version,
            up_to_version=up_to_version,
            up_to_position=up_to_position,
            as_of=as_of,
        )
        return [self.decode(row) for row in stored]

    def read_all(
        self, conn: psycopg.Connection[Any], *, after: int = 0, up_to: int | None = None, limit: int = 1000
    ) -> list[RecordedEvent[Any]]:
        """Events of every stream with ``after < position <= up_to``, in position order (the store as of ``up_to``).

        Final only up to a :meth:`high_water_mark`; to follow the log as it grows, use a projector.
        """
        return [
            self.decode(row)
            for row in event_store.read_positions(conn, self.schema, after=after, up_to=up_to, limit=limit)
        ]

    def high_water_mark(self, conn: psycopg.Connection[Any], *, timeout: float = 10.0) -> int | None:
        """A position up to which the log is final (``event_store.high_water_mark``); autocommit ``conn``."""
        return event_store.high_water_mark(conn, self.schema, timeout=timeout)

    def allow_rewrite(self, conn: psycopg.Connection[Any]) -> None:
        """Let ``conn``'s current transaction update or delete stored events (pruning, crypto-shredding).

        The store refuses both otherwise (it is append-only); the permission ends with the
        transaction (:func:`estafeta_sql.event_store.allow_rewrite`).
        """
        event_store.allow_rewrite(conn)

    def decode(self, row: event_store.StoredEvent) -> RecordedEvent[Any]:
        """The current-version event of a stored row; :class:`EventDecodeError` names where and why not."""
        try:
            event = self.registry.decode(row.type, row.schema_version, row.data)
        except EventDecodeError as exc:
            where = f"event at position {row.position} (stream {row.stream_id} version {row.version})"
            raise type(exc)(f"{where} in {self.schema}.events: {exc}") from None
        return RecordedEvent(
            event,
            row.stream_id,
            row.version,
            row.position,
            row.tx_id,
            row.event_id,
            row.type,
            row.schema_version,
            EventMetadata.from_json(row.metadata),
            row.recorded_at,
        )

    def _conflict(
        self, state: event_store.StreamState | None, stream_id: str, expected: int | None
    ) -> ConcurrencyConflict:
        where = f"stream {stream_id!r} in {self.schema}"
        if state is None:
            reason = f"{where} does not exist, expected version {expected}"
        elif state.newer_writer:
            reason = (
                f"{where} was last appended by a transaction newer than this one;"
                " retry in a new transaction (a stream's events must come in transaction order)"
            )
        elif expected == 0:
            reason = f"{where} already exists at version {state.version}, expected no stream"
        else:
            reason = f"{where} is at version {state.version}, expected {expected}"
        return ConcurrencyConflict(reason, stream_id=stream_id, actual=None if state is None else state.version)


def _expected_number(expected: ExpectedVersion) -> int | None:
    if expected is ANY:
        return None
    if expected is NO_STREAM:
        return 0
    if isinstance(expected, bool) or not isinstance(expected, int) or expected < 0:
        raise ValueError(f"expected_version must be a version >= 0, NO_STREAM or ANY, not {expected!r}")
    return expected


@contextlib.contextmanager
def _translate_conflicts(stream_id: str) -> Iterator[None]:
    """Turn the store's backstop constraint violations into estafeta errors (the transaction is then aborted)."""
    try:
        yield
    except psycopg.errors.UniqueViolation as exc:
        if exc.diag.constraint_name == "events_event_id_key":
            raise DuplicateEventId(f"an event appended to {stream_id!r} is already stored") from exc
        raise ConcurrencyConflict(f"stream {stream_id!r}: {exc.diag.message_primary}", stream_id=stream_id) from exc
    except (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected) as exc:
        raise ConcurrencyConflict(f"stream {stream_id!r}: {exc.diag.message_primary}", stream_id=stream_id) from exc
