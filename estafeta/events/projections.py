"""Projections: read models built from the event log, in batches, never skipping an event, never applying one twice.

A projection declares the event types it handles (``@handles``) and the tables it owns in
its service's schema. A :class:`Projector` reads the log gap-safely (only events of ended
transactions, in ``(tx_id, position)`` order; see :func:`estafeta_sql.event_store.read_safe`) and
applies each batch in ONE transaction with its checkpoint, which it locks first: a crash
at any instant leaves the read model and the checkpoint agreeing.

Bad input (an unknown event type, an event that fails to decode or upcast, a handler that
raises) is never passed over silently. With ``on_bad_event = OnBadEvent.STOP`` (the
default) the events before it are applied, the checkpoint stops just before it, the
projection is marked ``failed`` with the event's position and the reason, and the
projector stops; after a fix, a restart retries that event. With ``OnBadEvent.SKIP`` the
event is recorded in ``projection_dead_letters`` with the reason and the projector goes on.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import attrs
import psycopg
import psycopg.errors
from psycopg import sql

from estafeta.events.event_types import EventDecodeError
from estafeta.events.store import EventStore, RecordedEvent
from estafeta_sql import event_store, projection_store
from estafeta_sql.event_store import StoredEvent

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

_HANDLES = "__estafeta_handles__"
#: Suffix of the checkpoint of a side-by-side rebuild (and of the schema it builds its tables in).
REBUILD_SUFFIX = "__rebuild"
#: PostgreSQL's identifier limit, in bytes: it silently truncates a longer name to this many.
MAX_IDENTIFIER_BYTES = 63
#: Errors that say nothing about the event: the batch is rolled back and tried again later.
TRANSIENT_ERRORS = (
    psycopg.OperationalError,
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.LockNotAvailable,
)


def fit_identifier(name: str) -> str:
    """``name`` if PostgreSQL keeps it whole, else a prefix of it and a hash of all of it, in 63 bytes.

    Distinct names give distinct identifiers (up to a 48-bit hash) that PostgreSQL never truncates.
    """
    encoded = name.encode()
    if len(encoded) <= MAX_IDENTIFIER_BYTES:
        return name
    digest = hashlib.sha256(encoded).hexdigest()[:12]
    prefix = encoded[: MAX_IDENTIFIER_BYTES - len(digest) - 1].decode(errors="ignore")
    return f"{prefix}_{digest}"


def rebuild_schema(schema: str, projection: str) -> str:
    """The schema of its own where a rebuild of ``projection`` builds its tables.

    In a schema of their own, the copies have the live tables' names, so their indexes,
    constraints and sequences get exactly the names the live ones have: the switch-over
    moves them into ``schema`` and renames nothing.
    """
    return fit_identifier(f"{schema}{REBUILD_SUFFIX}_{projection}")


def check_table_names(cls: type[Projection]) -> None:
    """Refuse a projection whose table names PostgreSQL would truncate (a one-line ``ValueError``)."""
    for table in getattr(cls, "tables", {}):
        size = len(table.encode())
        if size > MAX_IDENTIFIER_BYTES:
            raise ValueError(
                f"projection {getattr(cls, 'name', cls.__name__)}: table name {table!r} is {size} bytes, and"
                f" PostgreSQL truncates names longer than {MAX_IDENTIFIER_BYTES} bytes: give it a shorter name"
            )


class OnBadEvent(enum.Enum):
    """What a projector does with an event it cannot apply."""

    #: Apply the events before it, mark the projection ``failed`` at its position, stop.
    STOP = "stop"
    #: Record it in ``projection_dead_letters`` with the reason, and go on.
    SKIP = "skip"


def handles(*event_types: type) -> Callable[[F], F]:
    """Mark a :class:`Projection` method ``fn(self, ctx, recorded)`` as the handler of ``event_types``."""

    def mark(fn: F) -> F:
        setattr(fn, _HANDLES, event_types)
        return fn

    return mark


class Projection:
    """Base of read models. Subclasses set ``name`` and ``tables`` and mark handlers with ``@handles``.

    ``tables`` maps each table's name to the DDL that creates it, where ``{name}`` stands
    for any of the projection's tables (the schema-qualified name, which a rebuild changes):
    ``{"order_totals": "CREATE TABLE {order_totals} (stream_id text PRIMARY KEY, n int)"}``.
    Handlers write through ``ctx.execute`` with the same placeholders. A projection that
    can apply a whole batch at once (one statement for many events) overrides
    :meth:`apply_batch` and lists its types in ``event_types``. With ``handles_any = True``
    it also gets every other event, in :meth:`apply_any`.
    """

    name: ClassVar[str]
    tables: ClassVar[Mapping[str, str]] = {}
    on_bad_event: ClassVar[OnBadEvent] = OnBadEvent.STOP
    handles_any: ClassVar[bool] = False
    #: Event classes handled by an :meth:`apply_batch` override (``@handles`` methods add theirs).
    event_types: ClassVar[tuple[type, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse, when the class is declared, table names longer than PostgreSQL keeps."""
        super().__init_subclass__(**kwargs)
        check_table_names(cls)

    def apply_batch(self, ctx: ProjectionContext, events: Sequence[RecordedEvent[Any]]) -> None:
        """Apply ``events``, in log order, inside the batch's transaction. By default, one handler call each."""
        handlers = handler_names(type(self))
        for recorded in events:
            method = handlers.get(type(recorded.event))
            if method is None:
                self.apply_any(ctx, recorded)
            else:
                getattr(self, method)(ctx, recorded)

    def apply_any(self, ctx: ProjectionContext, recorded: RecordedEvent[Any]) -> None:
        """Apply an event no ``@handles`` method takes (only called when ``handles_any`` is set)."""
        raise NotImplementedError(f"{type(self).__name__} sets handles_any but has no apply_any")


_HANDLER_NAMES: dict[type, dict[type, str]] = {}


def handler_names(cls: type[Projection]) -> dict[type, str]:
    """The ``@handles`` methods of a projection class, by event class (a subclass's wins)."""
    if cls not in _HANDLER_NAMES:
        found: dict[type, str] = {}
        for klass in reversed(cls.__mro__):
            for name, member in vars(klass).items():
                for event_type in getattr(member, _HANDLES, ()):
                    found[event_type] = name
        _HANDLER_NAMES[cls] = found
    return _HANDLER_NAMES[cls]


class ProjectionContext:
    """What a handler writes through: the batch's connection and the projection's table names."""

    def __init__(self, conn: psycopg.Connection[Any], schema: str, tables: Mapping[str, sql.Identifier]) -> None:
        #: The batch's connection, inside the transaction that also moves the checkpoint.
        self.conn = conn
        self.schema = schema
        self._tables = tables

    def table(self, name: str) -> sql.Identifier:
        """The schema-qualified identifier of the projection's table ``name`` (as built now)."""
        return self._tables[name]

    def execute(self, query: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> psycopg.Cursor[Any]:
        """Run ``query``, where ``{table}`` placeholders name the projection's tables, in the batch's transaction."""
        names = tuple((name, identifier.as_string(None)) for name, identifier in self._tables.items())
        return self.conn.execute(_compose(query, names), params)


@functools.lru_cache(maxsize=1024)
def _compose(query: str, tables: tuple[tuple[str, str], ...]) -> sql.Composed:
    """``query`` with its table placeholders replaced by the (already quoted) qualified names."""
    return sql.SQL(query).format(**{name: sql.SQL(quoted) for name, quoted in tables})


def lock_key(schema: str, checkpoint_name: str) -> str:
    """The key of the session advisory lock held by the one projector (or rebuild) of ``checkpoint_name``."""
    return f"estafeta.projection:{schema}.{checkpoint_name}"


@attrs.frozen
class BatchResult:
    """What one batch did."""

    #: Events read from the log (handled or not).
    read: int
    #: Events handed to the projection's handlers and committed.
    applied: int
    #: The checkpoint after the batch.
    checkpoint: tuple[int, int]
    #: The decoded events applied, in order (for hooks and metrics).
    events: list[RecordedEvent[Any]] = attrs.field(factory=list, repr=False)
    #: The bad event's description when the projection stopped on it (STOP), else ``None``.
    failed: str | None = None
    #: Bad events recorded as dead letters (SKIP).
    skipped: int = 0
    #: More events may be waiting: run the next batch at once.
    more: bool = False


@attrs.frozen
class _Bad:
    index: int
    reason: str


class Projector:
    """Applies the event log to one projection's tables, a batch per transaction.

    ``rebuild=True`` targets the side-by-side copy that :func:`estafeta.events.projection_ops.rebuild`
    builds and switches to: its checkpoint is suffixed ``__rebuild`` and its tables, under
    their own names, are in a schema of their own (:func:`rebuild_schema`).
    """

    def __init__(
        self, projection: Projection, store: EventStore, *, batch_size: int = 500, rebuild: bool = False
    ) -> None:
        self.projection = projection
        self.store = store
        self.schema = store.schema
        self.batch_size = batch_size
        self.rebuild = rebuild
        check_table_names(type(projection))
        self.checkpoint_name = projection.name + (REBUILD_SUFFIX if rebuild else "")
        #: The schema of the tables this projector writes: the service's, or the rebuild's own.
        self.table_schema = rebuild_schema(self.schema, projection.name) if rebuild else self.schema
        self._tables = {name: sql.Identifier(self.table_schema, name) for name in projection.tables}
        self._handled = set(handler_names(type(projection))) | set(projection.event_types)
        names = store.registry.names_of(list(self._handled))
        self._types: list[str] | None = None if projection.handles_any else names

    @property
    def lock_key(self) -> str:
        """The advisory lock that keeps a second projector of this projection (or rebuild) out."""
        return lock_key(self.schema, self.checkpoint_name)

    def table(self, name: str) -> sql.Identifier:
        """The schema-qualified identifier of the projection's table ``name`` as this projector writes it."""
        return self._tables[name]

    def create_tables(self, conn: psycopg.Connection[Any]) -> None:
        """Create the projection's missing tables and its checkpoint row (in the caller's transaction, if any)."""
        if self.rebuild:
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.table_schema)))
        for name, ddl in self.projection.tables.items():
            exists = conn.execute("SELECT to_regclass(%s)", (self._tables[name].as_string(None),)).fetchone()
            if exists is None or exists[0] is None:
                conn.execute(sql.SQL(ddl).format(**self._tables))
        state = "rebuilding" if self.rebuild else "running"
        projection_store.ensure_checkpoint(conn, self.schema, self.checkpoint_name, state)

    def drop_tables(self, conn: psycopg.Connection[Any]) -> None:
        """Drop the projection's tables (a rebuild's: its whole schema) and forget its checkpoint."""
        if self.rebuild:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.table_schema)))
        else:
            for table in self._tables.values():
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(table))
        projection_store.delete_checkpoint(conn, self.schema, self.checkpoint_name)

    def run_batch(self, conn: psycopg.Connection[Any]) -> BatchResult:
        """Apply up to ``batch_size`` safe events after the checkpoint, and move it, in one transaction.

        Nested in a caller's transaction, the batch is a savepoint of it (a rebuild's
        switch-over applies its last batches that way). Transient database errors
        propagate (nothing was committed); bad events are handled as the projection says.
        """
        with conn.transaction():
            checkpoint = projection_store.lock_checkpoint(conn, self.schema, self.checkpoint_name)
            if checkpoint is None:
                raise LookupError(f"no checkpoint row for projection {self.checkpoint_name!r}: create_tables() first")
            rows = self.read(conn, checkpoint.after)
            if not rows:
                return BatchResult(0, 0, checkpoint.after)
            items, bad = self._decode(rows)
            good = items if bad is None else items[: bad.index]
            bad = self._apply(conn, good) or bad
            return self._finish(conn, checkpoint, rows, items, bad)

    def read(self, conn: psycopg.Connection[Any], after: tuple[int, int]) -> list[StoredEvent]:
        """The next batch after the checkpoint ``after``: gap-safe (see :func:`estafeta_sql.event_store.read_safe`)."""
        return event_store.read_safe(conn, self.schema, after=after, limit=self.batch_size, types=self._types)

    def _decode(self, rows: list[StoredEvent]) -> tuple[list[RecordedEvent[Any] | None], _Bad | None]:
        """Decode the events this projection handles (``None`` for the others), up to the first bad one."""
        items: list[RecordedEvent[Any] | None] = []
        for index, row in enumerate(rows):
            if row.data is None:
                items.append(None)
                continue
            try:
                recorded = self.store.decode(row)
            except EventDecodeError as exc:
                return items, _Bad(index, str(exc))
            wanted = self.projection.handles_any or type(recorded.event) in self._handled
            items.append(recorded if wanted else None)
        return items, None

    def _apply(self, conn: psycopg.Connection[Any], items: list[RecordedEvent[Any] | None]) -> _Bad | None:
        """Apply ``items`` (pipelined, in a savepoint); on an error, find the culprit one event at a time."""
        ctx = ProjectionContext(conn, self.schema, self._tables)
        events = [recorded for recorded in items if recorded is not None]
        if not events:
            return None
        try:
            with conn.transaction(), conn.pipeline():
                self.projection.apply_batch(ctx, events)
            return None
        except TRANSIENT_ERRORS:
            raise
        except Exception:
            return self._apply_one_by_one(ctx, items)

    def _apply_one_by_one(self, ctx: ProjectionContext, items: list[RecordedEvent[Any] | None]) -> _Bad | None:
        for index, recorded in enumerate(items):
            if recorded is None:
                continue
            try:
                with ctx.conn.transaction():
                    self.projection.apply_batch(ctx, [recorded])
            except TRANSIENT_ERRORS:
                raise
            except Exception as exc:
                where = (
                    f"event at position {recorded.position} (stream {recorded.stream_id} version {recorded.version})"
                )
                return _Bad(index, f"{where}: {type(self.projection).__name__} failed on {recorded.type}: {exc!r}")
        return None

    def _finish(
        self,
        conn: psycopg.Connection[Any],
        checkpoint: projection_store.Checkpoint,
        rows: list[StoredEvent],
        items: list[RecordedEvent[Any] | None],
        bad: _Bad | None,
    ) -> BatchResult:
        """Move the checkpoint past what was applied and deal with the bad event, if any (same transaction)."""
        done = len(rows) if bad is None else bad.index
        applied = [item for item in items[:done] if item is not None]
        after = checkpoint.after
        if done:
            after = (rows[done - 1].tx_id, rows[done - 1].position)
            projection_store.advance_checkpoint(
                conn, self.schema, self.checkpoint_name, after=after, applied=len(applied)
            )
        if bad is None:
            return BatchResult(done, len(applied), after, applied, more=len(rows) == self.batch_size)
        row, name = rows[bad.index], self.checkpoint_name
        if self.projection.on_bad_event is OnBadEvent.SKIP:
            logger.warning("projection %s skipped a bad event: %s", name, bad.reason)
            projection_store.dead_letter(conn, self.schema, name, row, bad.reason)
            after = (row.tx_id, row.position)
            projection_store.advance_checkpoint(conn, self.schema, name, after=after, applied=0)
            return BatchResult(done + 1, len(applied), after, applied, skipped=1, more=True)
        logger.error("projection %s stopped: %s", name, bad.reason)
        projection_store.mark_failed(conn, self.schema, name, error=bad.reason, position=row.position)
        return BatchResult(done, len(applied), after, applied, failed=bad.reason)
