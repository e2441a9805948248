"""``ctx.events``: a step's view of its service's event store, joined to the step's transaction.

The events a step appends commit with its inbox row and its outbox rows, or not at all.
Each carries where it came from: ``causation_id`` is the id of the message being
processed, ``correlation_id`` the saga it belongs to, and the step's ``traceparent``. A
:class:`ConcurrencyConflict` is a transient error: the step's transaction rolls back and
Dramatiq retries the message, which then sees the stream's new version.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeVar

import psycopg

from estafeta.events.aggregates import Aggregate, Repository
from estafeta.events.store import ANY, EventMetadata, EventStore, ExpectedVersion, RecordedEvent

A = TypeVar("A", bound=Aggregate)


class StepEvents:
    """Appends, reads, loads and saves on the step's connection, with the step's metadata."""

    def __init__(self, conn: psycopg.Connection[Any], store: EventStore, metadata: EventMetadata) -> None:
        self.conn = conn
        self.store = store
        #: What every event appended here carries.
        self.metadata = metadata

    def append(
        self,
        stream_id: str,
        events: Sequence[Any],
        *,
        expected_version: ExpectedVersion = ANY,
        stream_type: str | None = None,
    ) -> list[RecordedEvent[Any]]:
        """Append ``events`` to ``stream_id`` in the step's transaction (see :meth:`EventStore.append`)."""
        return self.store.append(
            self.conn,
            stream_id,
            events,
            expected_version=expected_version,
            stream_type=stream_type,
            metadata=self.metadata,
        )

    def read(self, stream_id: str, **cut: Any) -> list[RecordedEvent[Any]]:
        """The stream's events (``up_to_version=``, ``as_of=``, ``up_to_position=`` cut it)."""
        return self.store.read(self.conn, stream_id, **cut)

    def load(
        self, aggregate: type[A], stream_id: str, *, version: int | None = None, as_of: datetime | None = None
    ) -> A:
        """The aggregate from its stream (with its snapshots); :class:`StreamNotFound` if it has no event."""
        return Repository(self.store, aggregate).load(self.conn, stream_id, version=version, as_of=as_of)

    def get(self, aggregate: type[A], stream_id: str) -> A | None:
        """Like :meth:`load`, ``None`` for a stream with no event."""
        return Repository(self.store, aggregate).get(self.conn, stream_id)

    def save(self, aggregate: Aggregate) -> list[RecordedEvent[Any]]:
        """Append the aggregate's new events with the version it was loaded at (a conflict retries the step)."""
        return Repository(self.store, type(aggregate)).save(self.conn, aggregate, metadata=self.metadata)
