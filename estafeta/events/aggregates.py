"""Event-sourced aggregates: state rebuilt from a stream, new events recorded, saved with the expected version.

An aggregate is an ``@attrs.define`` class deriving from :class:`Aggregate`, every field
with a default (an aggregate starts blank; its events set it), with one method marked
``@applies(EventClass)`` per event type. Business methods check their rules and call
:meth:`Aggregate.record`, which applies the event and keeps it for :meth:`Repository.save`.

Snapshots (``snapshot_every = N``) store the state every N events, keyed by the class's
``schema_version`` and a digest of its fields: after a schema change old snapshots are
ignored and the stream is replayed. Correctness never depends on a snapshot: deleting
any or all of them changes nothing but load time.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar, Generic, TypeVar, cast

import attrs
import psycopg

from estafeta.events.store import NO_STREAM, EventMetadata, EventStore, ExpectedVersion, RecordedEvent
from estafeta.messaging.messages import converter
from estafeta_sql import event_store
from estafeta_sql.errors import EstafetaError

logger = logging.getLogger(__name__)

A = TypeVar("A", bound="Aggregate")
F = TypeVar("F", bound=Callable[..., Any])

_APPLIES = "__estafeta_applies__"


class StreamNotFound(EstafetaError):
    """The stream has no event (at the requested point in time)."""


class NoApplyFor(EstafetaError):
    """The aggregate has no ``@applies`` method for an event type found in its stream."""


def applies(event_type: type) -> Callable[[F], F]:
    """Mark an :class:`Aggregate` method ``fn(self, event)`` as the one that applies ``event_type`` events."""

    def mark(fn: F) -> F:
        setattr(fn, _APPLIES, event_type)
        return fn

    return mark


class Aggregate:
    """Base of event-sourced aggregates (subclasses are ``@attrs.define`` classes, every field defaulted).

    Class settings: ``schema_version`` (bump it when the fields or the meaning of the
    state change: snapshots of other versions are ignored), ``snapshot_every`` (``None``:
    never), ``stream_type`` (the ``streams.type`` of its streams; default: the class name).
    """

    __slots__ = ("_estafeta_pending", "_estafeta_snapshot_version", "_estafeta_stream_id", "_estafeta_version")

    schema_version: ClassVar[int] = 1
    snapshot_every: ClassVar[int | None] = None
    stream_type: ClassVar[str | None] = None

    @classmethod
    def new(cls: type[A], stream_id: str) -> A:
        """A blank aggregate for a stream that does not exist yet (it will be saved with ``NO_STREAM``)."""
        aggregate = cls()
        aggregate._estafeta_init(stream_id, version=0, snapshot_version=0)
        return aggregate

    def _estafeta_init(self, stream_id: str, *, version: int, snapshot_version: int) -> None:
        self._estafeta_stream_id = stream_id
        self._estafeta_version = version
        self._estafeta_snapshot_version = snapshot_version
        self._estafeta_pending: list[Any] = []

    @property
    def stream_id(self) -> str:
        """The stream this aggregate's events live in."""
        return self._estafeta_stream_id

    @property
    def version(self) -> int:
        """Events applied so far, recorded-but-unsaved ones included."""
        return self._estafeta_version

    @property
    def pending_events(self) -> list[Any]:
        """Events recorded since the aggregate was loaded (or saved), oldest first."""
        return list(self._estafeta_pending)

    def record(self, event: Any) -> None:
        """Apply ``event`` to this aggregate and keep it for the next save, as version ``version + 1``."""
        self._estafeta_apply(event)
        self._estafeta_pending.append(event)

    def _estafeta_apply(self, event: Any) -> None:
        method = _appliers(type(self)).get(type(event))
        if method is None:
            raise NoApplyFor(f"{type(self).__name__} has no @applies method for {type(event).__name__}")
        method(self, event)
        self._estafeta_version += 1


_APPLIERS: dict[type, dict[type, Callable[[Any, Any], None]]] = {}
_FINGERPRINTS: dict[type, str] = {}


def _appliers(cls: type) -> dict[type, Callable[[Any, Any], None]]:
    """The ``@applies`` methods of ``cls`` by event class (a subclass's method wins over its base's)."""
    cached = _APPLIERS.get(cls)
    if cached is not None:
        return cached
    found: dict[type, Callable[[Any, Any], None]] = {}
    for klass in reversed(cls.__mro__):
        mine: dict[type, str] = {}
        for name, member in vars(klass).items():
            event_type = getattr(member, _APPLIES, None)
            if event_type is None:
                continue
            if event_type in mine:
                raise TypeError(
                    f"{klass.__name__}: two @applies methods for {event_type.__name__}: {mine[event_type]}, {name}"
                )
            mine[event_type] = name
            found[event_type] = member
    _APPLIERS[cls] = found  # computed once per class; a race computes the same dict twice
    return found


def _fingerprint(cls: type) -> str:
    """A digest of the class's fields (names and declared types): a change without a schema bump is caught."""
    if cls not in _FINGERPRINTS:
        fields = [(field.name, str(field.type)) for field in attrs.fields(cls)]
        _FINGERPRINTS[cls] = hashlib.sha256(repr((cls.__qualname__, fields)).encode()).hexdigest()[:16]
    return _FINGERPRINTS[cls]


class Repository(Generic[A]):
    """Loads and saves one aggregate class through an :class:`EventStore`, with its snapshots.

    Construction checks that every event type the class applies is registered.
    """

    def __init__(self, store: EventStore, aggregate: type[A]) -> None:
        if not attrs.has(cast(type, aggregate)):
            raise TypeError(f"{aggregate.__name__} must be an attrs class (@attrs.define)")
        store.registry.names_of(list(_appliers(aggregate)))
        self.store = store
        self.cls = aggregate
        self.name = aggregate.__qualname__

    def load(
        self,
        conn: psycopg.Connection[Any],
        stream_id: str,
        *,
        version: int | None = None,
        as_of: datetime | None = None,
        position: int | None = None,
    ) -> A:
        """The aggregate now, or as of a ``version``, a time (``as_of``) or a global ``position``.

        Raises :class:`StreamNotFound` when the stream had no event at that point.
        """
        found = self.get(conn, stream_id, version=version, as_of=as_of, position=position)
        if found is None:
            raise StreamNotFound(
                f"stream {stream_id!r} in {self.store.schema} has no event{_when(version, as_of, position)}"
            )
        return found

    def get(
        self,
        conn: psycopg.Connection[Any],
        stream_id: str,
        *,
        version: int | None = None,
        as_of: datetime | None = None,
        position: int | None = None,
    ) -> A | None:
        """Like :meth:`load`, but ``None`` when the stream had no event at that point."""
        target = version
        if as_of is not None or position is not None:
            cut = event_store.version_as_of(conn, self.store.schema, stream_id, as_of=as_of, up_to_position=position)
            target = cut if target is None else min(target, cut)
        if target == 0:
            return None
        aggregate, start = self._from_snapshot(conn, stream_id, target)
        for recorded in self.store.read(conn, stream_id, after_version=start, up_to_version=target):
            aggregate._estafeta_apply(recorded.event)
        return aggregate if aggregate.version > 0 else None

    def save(
        self,
        conn: psycopg.Connection[Any],
        aggregate: A,
        *,
        metadata: EventMetadata | None = None,
    ) -> list[RecordedEvent[Any]]:
        """Append the aggregate's pending events with the version it was loaded at, in ``conn``'s transaction.

        Raises :class:`ConcurrencyConflict` if the stream moved since the load: reload and
        retry. Writes a snapshot in the same transaction when ``snapshot_every`` events
        have passed since the last one this class (and schema version) has.
        """
        pending = aggregate._estafeta_pending
        if not pending:
            return []
        loaded_at = aggregate.version - len(pending)
        expected: ExpectedVersion = NO_STREAM if loaded_at == 0 else loaded_at
        recorded = self.store.append(
            conn,
            aggregate.stream_id,
            pending,
            expected_version=expected,
            stream_type=self.cls.stream_type or self.cls.__name__,
            metadata=metadata,
        )
        aggregate._estafeta_pending = []
        every = self.cls.snapshot_every
        if every and aggregate.version - aggregate._estafeta_snapshot_version >= every:
            self.take_snapshot(conn, aggregate)
        return recorded

    def take_snapshot(self, conn: psycopg.Connection[Any], aggregate: A) -> None:
        """Store the aggregate's saved state now (it must have no pending event), in ``conn``'s transaction."""
        if aggregate._estafeta_pending:
            raise ValueError(f"{self.name} {aggregate.stream_id!r} has unsaved events: save it first")
        event_store.put_snapshot(
            conn,
            self.store.schema,
            aggregate.stream_id,
            aggregate=self.name,
            schema_version=self.cls.schema_version,
            version=aggregate.version,
            fingerprint=_fingerprint(self.cls),
            state=converter.unstructure(aggregate),
        )
        aggregate._estafeta_snapshot_version = aggregate.version

    def _from_snapshot(self, conn: psycopg.Connection[Any], stream_id: str, target: int | None) -> tuple[A, int]:
        """The aggregate from its newest usable snapshot at or before ``target``, and its version; else blank."""
        blank = self.cls()
        blank._estafeta_init(stream_id, version=0, snapshot_version=0)
        if not self.cls.snapshot_every:
            return blank, 0
        found = event_store.latest_snapshot(
            conn,
            self.store.schema,
            stream_id,
            aggregate=self.name,
            schema_version=self.cls.schema_version,
            up_to_version=target,
        )
        if found is None:
            return blank, 0
        version, fingerprint, state = found
        if fingerprint != _fingerprint(self.cls):
            logger.warning(
                "ignoring the snapshot of %s %r at version %d: the class's fields changed without a"
                " schema_version bump (still %d); replaying the stream",
                self.name,
                stream_id,
                version,
                self.cls.schema_version,
            )
            return blank, 0
        try:
            aggregate = converter.structure(state, self.cls)
        except Exception as exc:
            logger.warning(
                "ignoring an unreadable snapshot of %s %r at version %d: %s", self.name, stream_id, version, exc
            )
            return blank, 0
        aggregate._estafeta_init(stream_id, version=version, snapshot_version=version)
        return aggregate, version


def _when(version: int | None, as_of: datetime | None, position: int | None) -> str:
    parts = [f"version {version}" if version is not None else "", f"time {as_of.isoformat()}" if as_of else ""]
    parts.append(f"position {position}" if position is not None else "")
    cut = ", ".join(p for p in parts if p)
    return f" as of {cut}" if cut else ""
