"""Applications written with the ``eventsourcing`` library (9.5), keeping their events in estafeta's store.

Select it like any of the library's persistence modules (``pip install 'estafeta[eventsourcing]'``)::

    app = BankAccounts(env={
        "PERSISTENCE_MODULE": "estafeta.eventsourcing",
        "ESTAFETA_DATABASE_URL": "postgresql://app@db/bank",
        "ESTAFETA_SCHEMA": "bank",  # the service schema: its streams, events, outbox, inbox
    })

The recorders write the library's stored events into the schema's ``streams`` and
``events`` tables (notification id = the event's global ``position``); notifications are
read only up to a high-water mark, so a follower never passes over an event that commits
later, and no writer waits for another's commit. ``app.save(aggregate, conn=conn)`` records
in the caller's transaction instead of one of its own, so the events commit together with
estafeta outbox rows (``service.send(conn, command)``), an inbox row, or anything else on
that connection. This is the one public module under ``estafeta`` besides the package itself.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing import persistence as es
from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    InfrastructureFactory,
    ListenNotifySubscription,
    Notification,
    ProcessRecorder,
    StoredEvent,
    Tracking,
    TrackingRecorder,
)
from eventsourcing.utils import Environment, EnvType, resolve_topic, strtobool

from estafeta.app.service import Service
from estafeta.events.es_store import MIGRATIONS, Store, data_to_state, state_to_data
from estafeta_sql import eventsourcing_store as rows
from estafeta_sql.event_store import WAKE_CHANNEL
from estafeta_sql.pool import notifications

__all__ = [
    "EstafetaAggregateRecorder",
    "EstafetaApplicationRecorder",
    "EstafetaProcessRecorder",
    "EstafetaSnapshotRecorder",
    "EstafetaSubscription",
    "EstafetaTrackingRecorder",
    "Factory",
    "use_eventsourcing",
]

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def use_eventsourcing(service: Service) -> None:
    """Add the adapter's tables (the event store, tracking, the library's snapshots) to ``service``'s schema.

    ``estafeta migrate`` then creates them; set ``CREATE_TABLE=no`` in the application's
    environment to leave table creation to it.
    """
    for name in MIGRATIONS:
        service.use_builtin_migrations(name)  # _common is every service's already: added once


class EstafetaAggregateRecorder(AggregateRecorder):
    """The library's stored events as events of estafeta's store: originator id = stream, version + 1 = version.

    A duplicate (originator, version) raises the library's ``IntegrityError`` and writes
    nothing. ``insert_events(..., conn=conn)`` writes in the caller's transaction.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        """Record ``stored_events`` atomically (in ``kwargs['conn']``'s transaction if given)."""
        self._record(stored_events, conn=kwargs.get("conn"))
        return None

    def _record(
        self,
        stored_events: Sequence[StoredEvent],
        *,
        conn: psycopg.Connection[Any] | None,
        tracking: Tracking | None = None,
    ) -> list[int]:
        new = [
            rows.EventRow(str(e.originator_id), e.originator_version + 1, e.topic, state_to_data(e.state))
            for e in stored_events
        ]
        if not new and tracking is None:
            return []
        with self.store.writing(conn) as c:
            if tracking is not None:
                _track(self.store, c, tracking)
            return rows.insert_events(c, self.store.schema, new) if new else []

    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        """The originator's events with ``gt < originator_version <= lte``, in version order."""
        with self.store.reading() as conn:
            found = rows.select_stream(
                conn,
                self.store.schema,
                str(originator_id),
                after=None if gt is None else gt + 1,
                up_to=None if lte is None else lte + 1,
                desc=desc,
                limit=limit,
            )
        return [StoredEvent(originator_id, r.version - 1, r.type, data_to_state(r.data)) for r in found]


class EstafetaSnapshotRecorder(AggregateRecorder):
    """The library's snapshots, byte for byte, in the schema's ``eventsourcing_snapshots`` table."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        """Record the snapshots atomically; a duplicate (originator, version) raises ``IntegrityError``."""
        if stored_events:
            with self.store.writing(kwargs.get("conn")) as conn:
                new = [(str(e.originator_id), e.originator_version, e.topic, e.state) for e in stored_events]
                rows.insert_snapshots(conn, self.store.schema, new)
        return None

    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        """The originator's snapshots with ``gt < originator_version <= lte``, in version order."""
        with self.store.reading() as conn:
            found = rows.select_snapshots(
                conn, self.store.schema, str(originator_id), after=gt, up_to=lte, desc=desc, limit=limit
            )
        return [StoredEvent(originator_id, version, topic, state) for _, version, topic, state in found]


class EstafetaApplicationRecorder(EstafetaAggregateRecorder, ApplicationRecorder):
    """Also the application sequence: notification ids are the events' global positions.

    Ids grow with each event but have holes (positions of rolled-back transactions). Reads
    stop at a high-water mark: every position up to it is committed or rolled back for good,
    so a reader that resumes after the last id it saw skips nothing.
    """

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        """Record ``stored_events``; their notification ids (``None`` for no events)."""
        return self._record(stored_events, conn=kwargs.get("conn")) or None

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        """Up to ``limit`` notifications from ``start`` to ``stop``, never past the high-water mark.

        A page that fills up below the last mark found needs no new one (a catch-up read
        waits once); otherwise the mark is brought up to date first.
        """
        first = 1 if start is None else start if inclusive_of_start else start + 1
        schema = self.store.schema
        with self.store.reading() as conn:
            mark = self.store.last_mark
            found = rows.select_notifications(
                conn, schema, first=first, up_to=_below(mark, stop), limit=limit, topics=topics
            )
            if len(found) < limit and (stop is None or stop > mark):
                mark = self.store.high_water_mark(conn)
                found = rows.select_notifications(
                    conn, schema, first=first, up_to=_below(mark, stop), limit=limit, topics=topics
                )
        return [
            Notification(
                id=r.position,
                originator_id=self.store.originator_id(r.stream_id),
                originator_version=r.version - 1,
                topic=r.type,
                state=data_to_state(r.data),
            )
            for r in found
        ]

    def max_notification_id(self) -> int | None:
        """The largest notification id at or below the high-water mark; ``None`` if there is none."""
        with self.store.reading() as conn:
            return rows.max_position(conn, self.store.schema, up_to=self.store.high_water_mark(conn))

    def subscribe(self, gt: int | None = None, topics: Sequence[str] = ()) -> EstafetaSubscription:
        """Notifications after ``gt``, then new ones as they become final (woken by the store's NOTIFY)."""
        return EstafetaSubscription(self, gt=gt, topics=topics)


class EstafetaSubscription(ListenNotifySubscription[EstafetaApplicationRecorder]):
    """Pulls when the store NOTIFYs ``estafeta_events`` for this schema, and at least every second.

    The poll catches events that were held back by an older open transaction when their
    own NOTIFY came (a NOTIFY is a wake-up, never the source of truth).
    """

    poll_interval = 1.0

    def __init__(self, recorder: EstafetaApplicationRecorder, gt: int | None = None, topics: Sequence[str] = ()):
        super().__init__(recorder=recorder, gt=gt, topics=topics)
        self._listen_thread = threading.Thread(target=self._listen, daemon=True)
        self._listen_thread.start()

    def __exit__(self, *args: object, **kwargs: Any) -> None:
        try:
            super().__exit__(*args, **kwargs)
        finally:
            self._listen_thread.join()

    def _listen(self) -> None:
        store = self._recorder.store
        try:
            with psycopg.connect(store.db.dsn, autocommit=True) as conn:
                conn.execute(f"LISTEN {WAKE_CHANNEL}")
                polled = time.monotonic()
                while not self._has_been_stopped and not self._thread_error:
                    for notify in notifications(conn, 0.1):
                        if notify.payload == store.schema:
                            self._has_been_notified.set()
                    if time.monotonic() - polled >= self.poll_interval:
                        polled = time.monotonic()
                        self._has_been_notified.set()
        except BaseException as exc:
            if self._thread_error is None:
                self._thread_error = exc
            self.stop()


class EstafetaTrackingRecorder(TrackingRecorder):
    """Each upstream application's position in the schema's ``eventsourcing_tracking`` (one row each).

    A position only moves forward: recording an id at or below it raises ``IntegrityError``.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def insert_tracking(self, tracking: Tracking) -> None:
        """Record ``tracking`` in a transaction of its own."""
        with self.store.writing() as conn:
            _track(self.store, conn, tracking)

    def max_tracking_id(self, application_name: str) -> int | None:
        """The last notification id recorded for ``application_name``, or ``None``."""
        with self.store.reading() as conn:
            return rows.max_tracking_id(conn, self.store.schema, application_name)


class EstafetaProcessRecorder(EstafetaTrackingRecorder, EstafetaApplicationRecorder, ProcessRecorder):
    """Events and the tracking of the notification they answer, in one transaction."""

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        """Record ``stored_events`` and ``kwargs['tracking']`` together; their notification ids."""
        return self._record(stored_events, conn=kwargs.get("conn"), tracking=kwargs.get("tracking")) or None


def _below(mark: int, stop: int | None) -> int:
    return mark if stop is None else min(stop, mark)


def _track(store: Store, conn: psycopg.Connection[Any], tracking: Tracking) -> None:
    if not rows.insert_tracking(conn, store.schema, tracking.application_name, tracking.notification_id):
        raise es.IntegrityError(
            f"{tracking.application_name} is already at or past notification {tracking.notification_id}"
            f" in {store.schema}.eventsourcing_tracking"
        )


class Factory(InfrastructureFactory[EstafetaTrackingRecorder]):
    """The library's infrastructure factory for estafeta's store (``PERSISTENCE_MODULE=estafeta.eventsourcing``).

    Environment (each may be prefixed by the application's name, as the library does):
    ``ESTAFETA_DATABASE_URL`` (a PostgreSQL DSN) and ``ESTAFETA_SCHEMA`` (the service
    schema), both required; ``ESTAFETA_POOL_SIZE`` (5); ``ESTAFETA_ORIGINATOR_ID_TYPE``
    (``uuid`` or ``text``); ``ESTAFETA_NOTIFICATION_TIMEOUT`` (seconds a read waits for the
    high-water mark, 10); ``CREATE_TABLE`` (``yes``: create the tables if missing).
    """

    DATABASE_URL = "ESTAFETA_DATABASE_URL"
    SCHEMA = "ESTAFETA_SCHEMA"
    POOL_SIZE = "ESTAFETA_POOL_SIZE"
    ORIGINATOR_ID_TYPE = "ESTAFETA_ORIGINATOR_ID_TYPE"
    NOTIFICATION_TIMEOUT = "ESTAFETA_NOTIFICATION_TIMEOUT"
    CREATE_TABLE = "CREATE_TABLE"

    def __init__(self, env: Environment | EnvType | None):
        super().__init__(env)
        schema = self._required(self.SCHEMA)
        if not _SCHEMA_NAME.match(schema):
            raise es.InfrastructureFactoryError(
                f"{self.SCHEMA}={schema!r} is not a service schema name ([a-z_][a-z0-9_]*)"
            )
        id_type = self.env.get(self.ORIGINATOR_ID_TYPE, "uuid").lower()
        if id_type not in ("uuid", "text"):
            raise es.InfrastructureFactoryError(f"{self.ORIGINATOR_ID_TYPE}={id_type!r}: expected uuid or text")
        self.store = Store(
            self._required(self.DATABASE_URL),
            schema,
            pool_size=self._number(self.POOL_SIZE, "5"),
            uuid_ids=id_type == "uuid",
            mark_timeout=self._seconds(self.NOTIFICATION_TIMEOUT, "10"),
        )
        # Tables are created with the first recorder: the library also builds factories only
        # for their mappers (a follower's, for each leader), which must not touch the database.
        self._create_tables = strtobool(self.env.get(self.CREATE_TABLE, "yes"))

    def _ready(self) -> Store:
        if self._create_tables:
            self.store.migrate()
            self._create_tables = False
        return self.store

    def _required(self, key: str) -> str:
        value = self.env.get(key)
        if not value:
            raise es.InfrastructureFactoryError(f"{key} is not set (estafeta.eventsourcing needs it)")
        return value

    def _number(self, key: str, default: str) -> int:
        value = self.env.get(key, default)
        if not value.isdigit() or int(value) < 1:
            raise es.InfrastructureFactoryError(f"{key}={value!r}: expected a whole number >= 1")
        return int(value)

    def _seconds(self, key: str, default: str) -> float:
        value = self.env.get(key, default)
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not seconds >= 0:
            raise es.InfrastructureFactoryError(f"{key}={value!r}: expected a number of seconds >= 0")
        return seconds

    def aggregate_recorder(self, purpose: str = "events") -> AggregateRecorder:
        """Events in the event store, or (``purpose="snapshots"``) the library's snapshots."""
        if purpose == "snapshots":
            return EstafetaSnapshotRecorder(self._ready())
        return EstafetaAggregateRecorder(self._ready())

    def application_recorder(self) -> ApplicationRecorder:
        """An :class:`EstafetaApplicationRecorder` (or ``APPLICATION_RECORDER_TOPIC``'s class)."""
        topic = self.env.get(self.APPLICATION_RECORDER_TOPIC)
        cls: type[EstafetaApplicationRecorder] = resolve_topic(topic) if topic else EstafetaApplicationRecorder
        return cls(self._ready())

    def tracking_recorder(
        self, tracking_recorder_class: type[EstafetaTrackingRecorder] | None = None
    ) -> EstafetaTrackingRecorder:
        """An :class:`EstafetaTrackingRecorder` (or the given class, or ``TRACKING_RECORDER_TOPIC``'s)."""
        if tracking_recorder_class is None:
            topic = self.env.get(self.TRACKING_RECORDER_TOPIC)
            tracking_recorder_class = resolve_topic(topic) if topic else EstafetaTrackingRecorder
        return tracking_recorder_class(self._ready())

    def process_recorder(self) -> ProcessRecorder:
        """An :class:`EstafetaProcessRecorder` (or ``PROCESS_RECORDER_TOPIC``'s class)."""
        topic = self.env.get(self.PROCESS_RECORDER_TOPIC)
        cls: type[EstafetaProcessRecorder] = resolve_topic(topic) if topic else EstafetaProcessRecorder
        return cls(self._ready())

    def close(self) -> None:
        """Close the connection pool."""
        self.store.close()
