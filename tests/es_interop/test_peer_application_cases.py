"""The library's example application test case, unmodified, with estafeta.eventsourcing as the persistence module.

``ExampleApplicationTestCase`` (its bank accounts: snapshots taken by hand, the notification
log) reads its persistence settings from the process environment, as the library's own
PostgreSQL run of it does. (The library's projection test cases need msgspec, which nothing
else here does; ``test_projection_runner.py`` runs the library's projection runner instead.)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.es_interop.support import drop_schema, require_eventsourcing

require_eventsourcing()

from eventsourcing.tests import application as peer_apps  # noqa: E402


class TestExampleApplication(peer_apps.ExampleApplicationTestCase):
    expected_factory_topic = "estafeta.eventsourcing:Factory"

    @pytest.fixture(autouse=True)
    def _environment(self, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        schema = f"es_{uuid.uuid4().hex[:12]}"
        monkeypatch.setenv("PERSISTENCE_MODULE", "estafeta.eventsourcing")
        monkeypatch.setenv("ESTAFETA_DATABASE_URL", database_url)
        monkeypatch.setenv("ESTAFETA_SCHEMA", schema)
        yield
        drop_schema(database_url, schema)
