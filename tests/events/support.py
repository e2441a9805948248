"""What the event store tests share besides fixtures: a migrated schema and how to reach it."""

from __future__ import annotations

from typing import Any

import attrs
import psycopg

from estafeta_sql import migrate


def migrate_events(conn: psycopg.Connection[Any], schema: str) -> None:
    """Apply the messaging and event store migrations to ``schema``."""
    directories = [migrate.builtin_directory("_common"), migrate.builtin_directory("_events")]
    migrate.apply(conn, schema, migrate.load(directories))


@attrs.frozen
class EventSchema:
    """A migrated service schema of one test, in the run's event database."""

    dsn: str
    schema: str

    def connect(self, *, autocommit: bool = True) -> psycopg.Connection[Any]:
        """A new connection to the database (autocommit unless told otherwise)."""
        return psycopg.connect(self.dsn, autocommit=autocommit)
