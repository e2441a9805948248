"""A schema of its own for each test, and the check that the ``eventsourcing`` extra is installed."""

from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import psycopg
import pytest
from psycopg import sql


def require_eventsourcing() -> None:
    """Skip the calling module without the ``eventsourcing`` extra (fail under CI: ``make test`` installs it)."""
    if importlib.util.find_spec("eventsourcing") is not None:
        return
    message = "the eventsourcing library is not installed (pip install -e '.[eventsourcing]')"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI is set, so this is a failure, not a skip", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def drop_schema(dsn: str, schema: str) -> None:
    """Drop ``schema`` and everything in it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


class FreshSchema:
    """Mixin for the library's test cases: each test gets a new schema, so notification ids start at 1.

    The test case's ``create_recorder`` (the only hook the library's cases need) takes its
    recorder from ``self.factory``, estafeta.eventsourcing's infrastructure factory on that
    schema. ``database_url`` skips without PostgreSQL, and fails under CI.
    """

    #: Connections: the library's concurrency cases run 10 writers and 2 readers at once.
    pool_size = 12
    #: More of the factory's environment (``ESTAFETA_ORIGINATOR_ID_TYPE``...).
    extra_env: ClassVar[dict[str, str]] = {}
    factory: Any
    schema: str

    @pytest.fixture(autouse=True)
    def _fresh_schema(self, database_url: str) -> Iterator[None]:
        from estafeta.eventsourcing import Factory

        self.schema = f"es_{uuid.uuid4().hex[:12]}"
        env = {
            "ESTAFETA_DATABASE_URL": database_url,
            "ESTAFETA_SCHEMA": self.schema,
            "ESTAFETA_POOL_SIZE": str(self.pool_size),
            **self.extra_env,
        }
        self.factory = Factory(env)
        try:
            yield
        finally:
            self.factory.close()
            drop_schema(database_url, self.schema)
