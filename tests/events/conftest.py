"""Fixtures of the event store tests: a scratch database, and a fresh service schema per test.

Kept apart from the root ``conftest.py`` (and from the order system's services): the event store is a
migration any service can opt into, so these tests apply it to schemas of their own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from ..services import scratch_database
from .support import EventSchema, migrate_events


@pytest.fixture(scope="session")
def event_database() -> Iterator[str]:
    """A database of this run's own for the event store tests."""
    with scratch_database() as dsn:
        yield dsn


@pytest.fixture
def event_schema(event_database: str) -> Iterator[EventSchema]:
    """A service schema with the event store, new for each test, dropped afterwards."""
    schema = f"ev_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(event_database, autocommit=True) as conn:
        migrate_events(conn, schema)
    yield EventSchema(event_database, schema)
    with psycopg.connect(event_database, autocommit=True) as conn:
        # A failed test may have left a connection in an open transaction: end it, or the
        # DROP would wait for it (the database is this run's own, and its tests run one by one).
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def conn(event_schema: EventSchema) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test's database."""
    with event_schema.connect() as connection:
        yield connection
