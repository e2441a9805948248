"""A database's identity, whatever host name, port or pooler reached it (``sql/deployment.sql``)."""

from __future__ import annotations

import attrs
import psycopg

from .pool import describe_dsn, translate_errors
from .queries import body


@attrs.frozen(order=True)
class DatabaseIdentity:
    """One database: its cluster and its name."""

    #: ``pg_control_system().system_identifier``: the cluster's, kept by its physical standbys.
    system_identifier: str
    #: ``current_database()``.
    database: str


def database_identity(dsn: str) -> DatabaseIdentity:
    """The identity of ``dsn``'s database, asked on a connection of its own.

    Raises :class:`estafeta_sql.errors.DatabaseUnavailable` when the server cannot be reached.
    """
    with translate_errors(describe_dsn(dsn)), psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(body("deployment.sql", "database_identity")).fetchone()
    assert row is not None
    return DatabaseIdentity(str(row[0]), str(row[1]))
