"""What :mod:`estafeta.eventsourcing`'s recorders share: the pool, the schema, error translation, the state codec.

Needs the ``eventsourcing`` extra; imported only by :mod:`estafeta.eventsourcing`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
from eventsourcing import persistence as es
from psycopg import pq

from estafeta_sql import event_store, migrate
from estafeta_sql.errors import DatabaseUnavailable, EstafetaError
from estafeta_sql.eventsourcing_store import StreamOrderRefused
from estafeta_sql.pool import Database

#: What the adapter's schema needs: the messaging tables (outbox, inbox), the event store,
#: and the library's tracking and snapshot tables.
MIGRATIONS = ("_common", "_events", "_eventsourcing")

# psycopg's errors and the library's (both follow PEP 249), most specific first.
_ERRORS: tuple[tuple[type[psycopg.Error], type[es.PersistenceError]], ...] = (
    (psycopg.IntegrityError, es.IntegrityError),
    (psycopg.DataError, es.DataError),
    (psycopg.OperationalError, es.OperationalError),
    (psycopg.InternalError, es.InternalError),
    (psycopg.ProgrammingError, es.ProgrammingError),
    (psycopg.NotSupportedError, es.NotSupportedError),
    (psycopg.DatabaseError, es.DatabaseError),
    (psycopg.InterfaceError, es.InterfaceError),
)


@contextlib.contextmanager
def translated(where: str) -> Iterator[None]:
    """Raise the library's exception types (which its applications expect) for database errors."""
    try:
        yield
    except StreamOrderRefused as exc:
        raise es.IntegrityError(str(exc)) from exc
    except psycopg.Error as exc:
        target = next((t for s, t in _ERRORS if isinstance(exc, s)), es.PersistenceError)
        text = str(exc).strip().splitlines()
        raise target(f"{where}: {text[0] if text else type(exc).__name__}") from exc
    except DatabaseUnavailable as exc:
        raise es.OperationalError(str(exc)) from exc
    except EstafetaError as exc:
        raise es.DatabaseError(str(exc)) from exc


class Store:
    """One service schema of one database, as the adapter's recorders use it."""

    def __init__(
        self, dsn: str, schema: str, *, pool_size: int = 5, uuid_ids: bool = True, mark_timeout: float = 10.0
    ) -> None:
        #: Pooled autocommit connections (idle-in-transaction sessions are ended after 60 s).
        self.db = Database(dsn, max_size=pool_size)
        self.schema = schema
        #: Stream ids that are UUIDs come back as :class:`uuid.UUID` (the library's default).
        self.uuid_ids = uuid_ids
        #: How long a read waits for the high-water mark before using the last one.
        self.mark_timeout = mark_timeout
        self._mark = 0
        self._mark_lock = threading.Lock()

    def migrate(self) -> list[str]:
        """Create the schema's tables (:data:`MIGRATIONS`) unless they exist; the names applied."""
        migrations = migrate.load([migrate.builtin_directory(name) for name in MIGRATIONS])
        with self.reading() as conn:
            return migrate.apply(conn, self.schema, migrations)

    @contextlib.contextmanager
    def reading(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled autocommit connection."""
        with translated(self.schema), self.db.connection() as conn, translated(self.schema):
            yield conn

    @contextlib.contextmanager
    def writing(self, conn: psycopg.Connection[Any] | None = None) -> Iterator[psycopg.Connection[Any]]:
        """A transaction of our own that commits at the end, or a savepoint in the caller's ``conn``.

        With ``conn``, nothing is committed: the caller's transaction decides, and a failed
        write rolls back to the savepoint, leaving that transaction usable.
        """
        if conn is None:
            with translated(self.schema), self.db.transaction() as own, translated(self.schema):
                yield own
            return
        if conn.info.transaction_status == pq.TransactionStatus.IDLE:
            if conn.autocommit:
                raise ValueError(
                    "conn= must be in a transaction (inside `with conn.transaction():`): nothing commits it"
                )
            conn.execute("SELECT 1")  # opens the caller's implicit transaction, which the caller commits
        with translated(self.schema), conn.transaction():
            yield conn

    @property
    def last_mark(self) -> int:
        """The last high-water mark found (0 before the first): the log is final up to it."""
        with self._mark_lock:
            return self._mark

    def high_water_mark(self, conn: psycopg.Connection[Any]) -> int:
        """A position up to which the log is final (never less than one returned before).

        If a transaction somewhere on the server stays open longer than ``mark_timeout``,
        the last mark found is returned: reads stay gap-free and catch up when it ends.
        """
        mark = event_store.high_water_mark(conn, self.schema, timeout=self.mark_timeout)
        with self._mark_lock:
            if mark is not None and mark > self._mark:
                self._mark = mark
            return self._mark

    def originator_id(self, stream_id: str) -> uuid.UUID | str:
        """The library's originator id of a stream: a UUID if it is one (in canonical form) and ids are UUIDs."""
        if self.uuid_ids:
            with contextlib.suppress(ValueError):
                value = uuid.UUID(stream_id)
                if str(value) == stream_id:
                    return value
        return stream_id

    def close(self) -> None:
        """Close the pool."""
        self.db.close()


def state_to_data(state: bytes) -> Any:
    """The ``events.data`` value for a stored event's state.

    A state that is a JSON object jsonb can hold exactly (the library's JSON transcoder
    writes those) is stored as that object, so SQL can read it; anything else (compressed
    or encrypted states) as a JSON string holding the base64 of the bytes. The two never
    mix up: states are objects or strings.
    """
    try:
        value = json.loads(state.decode("utf-8"), parse_constant=_refuse_constant)
    except ValueError:
        value = None
    if isinstance(value, dict) and _fits_jsonb(value):
        return value
    return base64.b64encode(state).decode("ascii")


def data_to_state(text: str) -> bytes:
    """A stored event's state from ``events.data`` as PostgreSQL prints it: the bytes, or the object's JSON.

    An object comes back as the same JSON value in jsonb's text form (its key order and
    spacing): the library decodes it to the same event, though not from the bytes it wrote.
    A string is base64, which JSON never escapes.
    """
    if text.startswith('"'):
        return base64.b64decode(text[1:-1])
    return text.encode("utf-8")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _fits_jsonb(value: Any) -> bool:
    """Whether jsonb stores ``value`` so that reading it back gives an equal value of the same type."""
    if isinstance(value, dict):
        return all(_fits_text(k) and _fits_jsonb(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_fits_jsonb(v) for v in value)
    if isinstance(value, str):
        return _fits_text(value)
    if isinstance(value, float):
        # jsonb prints numbers without exponents (1e+16 would come back as an int) and has no -0.
        return math.isfinite(value) and "e" not in repr(value) and not (value == 0 and math.copysign(1, value) < 0)
    return True  # int, bool, None


def _fits_text(text: str) -> bool:
    # jsonb refuses \u0000, and lone surrogates are not UTF-8.
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
