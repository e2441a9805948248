"""The recorder test cases that ship inside the eventsourcing library, unmodified, against estafeta's store.

Each class subclasses one of the library's cases (``eventsourcing.tests.persistence``) and
implements only the hook it requires, ``create_recorder``, with the recorder
``estafeta.eventsourcing.Factory`` builds on a fresh schema. ``test_insert_subscribe`` runs
the case's ``optional_test_insert_subscribe``, as the library's own PostgreSQL tests do.
"""

from __future__ import annotations

from tests.es_interop.support import FreshSchema, require_eventsourcing

require_eventsourcing()

from eventsourcing.persistence import (  # noqa: E402
    AggregateRecorder,
    ApplicationRecorder,
    ProcessRecorder,
    TrackingRecorder,
)
from eventsourcing.tests import persistence as peer  # noqa: E402


class TestAggregateRecorder(FreshSchema, peer.AggregateRecorderTestCase):
    """The library's events in estafeta's ``streams`` and ``events`` tables."""

    def create_recorder(self) -> AggregateRecorder:
        return self.factory.aggregate_recorder()  # type: ignore[no-any-return]


class TestSnapshotRecorder(FreshSchema, peer.AggregateRecorderTestCase):
    """The library's snapshots (the aggregate recorder for ``purpose="snapshots"``)."""

    def create_recorder(self) -> AggregateRecorder:
        return self.factory.aggregate_recorder(purpose="snapshots")  # type: ignore[no-any-return]


class TestApplicationRecorder(FreshSchema, peer.ApplicationRecorderTestCase[ApplicationRecorder]):
    """Notification ids = global positions, read up to the high-water mark; with the concurrency cases."""

    def create_recorder(self) -> ApplicationRecorder:
        return self.factory.application_recorder()  # type: ignore[no-any-return]

    def test_insert_subscribe(self) -> None:
        self.optional_test_insert_subscribe()


class TestTrackingRecorder(FreshSchema, peer.TrackingRecorderTestCase):
    """Tracking in the schema's ``eventsourcing_tracking`` table."""

    def create_recorder(self) -> TrackingRecorder:
        return self.factory.tracking_recorder()  # type: ignore[no-any-return]


class TestProcessRecorder(FreshSchema, peer.ProcessRecorderTestCase):
    """Events and tracking in one transaction."""

    def create_recorder(self) -> ProcessRecorder:
        return self.factory.process_recorder()  # type: ignore[no-any-return]


class TestNonInterleavingNotificationIDs(FreshSchema, peer.NonInterleavingNotificationIDsBaseCase):
    """Two concurrent batches of 1,000 events get two runs of positions, not interleaved ones."""

    def create_recorder(self) -> ApplicationRecorder:
        return self.factory.application_recorder()  # type: ignore[no-any-return]
