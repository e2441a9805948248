"""The recorder test cases that ship inside the eventsourcing library, unmodified, against estafeta's store.

Each class subclasses one of the library's cases (``eventsourcing.tests.persistence``) and
implements only the hook it requires, ``create_recorder``, with the recorder
``estafeta.eventsourcing.Factory`` builds on a fresh schema. ``test_insert_subscribe`` runs
the case's ``optional_test_insert_subscribe``, as the library's own PostgreSQL tests do.
``InfrastructureFactoryTestCase`` runs too, with the hooks it requires (the expected classes).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import ClassVar

import pytest

from tests.es_interop.support import FreshSchema, drop_schema, require_eventsourcing

require_eventsourcing()

from eventsourcing.persistence import (  # noqa: E402
    AggregateRecorder,
    ApplicationRecorder,
    ProcessRecorder,
    TrackingRecorder,
)
from eventsourcing.tests import persistence as peer  # noqa: E402
from eventsourcing.utils import Environment  # noqa: E402

from estafeta.eventsourcing import (  # noqa: E402
    EstafetaAggregateRecorder,
    EstafetaApplicationRecorder,
    EstafetaProcessRecorder,
    EstafetaTrackingRecorder,
    Factory,
)


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


class TestApplicationRecorderWithTextIds(TestApplicationRecorder):
    """The same with text originator ids (``ESTAFETA_ORIGINATOR_ID_TYPE=text``), as the library tests its own."""

    extra_env: ClassVar[dict[str, str]] = {"ESTAFETA_ORIGINATOR_ID_TYPE": "text"}

    def new_originator_id(self) -> str:
        return str(uuid.uuid4())  # read back as this str, not as a UUID


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


class SubclassedTrackingRecorder(EstafetaTrackingRecorder):
    """A tracking recorder class chosen by argument or by TRACKING_RECORDER_TOPIC."""


class TestInfrastructureFactory(peer.InfrastructureFactoryTestCase[Factory]):
    """The library's factory case: PERSISTENCE_MODULE=estafeta.eventsourcing, mappers, recorder classes."""

    @pytest.fixture(autouse=True)
    def _environment(self, database_url: str) -> Iterator[None]:
        schema = f"es_{uuid.uuid4().hex[:12]}"
        self.env = Environment(
            env={
                "PERSISTENCE_MODULE": "estafeta.eventsourcing",
                "ESTAFETA_DATABASE_URL": database_url,
                "ESTAFETA_SCHEMA": schema,
            }
        )
        try:
            yield
        finally:
            drop_schema(database_url, schema)

    def expected_factory_class(self) -> type[Factory]:
        return Factory

    def expected_aggregate_recorder_class(self) -> type[AggregateRecorder]:
        return EstafetaAggregateRecorder

    def expected_application_recorder_class(self) -> type[ApplicationRecorder]:
        return EstafetaApplicationRecorder

    def expected_tracking_recorder_class(self) -> type[TrackingRecorder]:
        return EstafetaTrackingRecorder

    def tracking_recorder_subclass(self) -> type[TrackingRecorder]:
        return SubclassedTrackingRecorder

    def expected_process_recorder_class(self) -> type[ProcessRecorder]:
        return EstafetaProcessRecorder
