"""Numbered ``.sql`` migrations per service schema, applied once, from any number of processes."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from importlib import resources
from importlib.abc import Traversable
from typing import Any

import attrs
import psycopg
import psycopg.errors
from psycopg import sql

from .errors import MigrationError

_NUMBERED = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")

#: Serialises migrations across processes (transaction-scoped, so a killed migrator frees it).
_MIGRATION_LOCK = sql.SQL("SELECT pg_advisory_xact_lock(hashtext('estafeta.migrate'))")


@attrs.frozen
class Migration:
    """One migration file."""

    #: ``<directory>/<file>``, as recorded in ``<schema>.schema_migrations``.
    name: str
    #: The SQL it runs.
    text: str


def builtin_directory(name: str) -> Traversable:
    """A directory of migrations shipped in ``sql/migrations/`` (``_common`` or a service name)."""
    return resources.files(__package__).joinpath("migrations", name)


def load(directories: Iterable[Traversable]) -> list[Migration]:
    """The migrations in ``directories``, in order: each directory's files by number."""
    found: list[Migration] = []
    for directory in directories:
        files = sorted((entry for entry in directory.iterdir() if _NUMBERED.match(entry.name)), key=lambda e: e.name)
        found.extend(Migration(f"{directory.name}/{entry.name}", entry.read_text(encoding="utf-8")) for entry in files)
    return found


def _ensure_bookkeeping(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.schema_migrations"
            " (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        ).format(sql.Identifier(schema))
    )


def _applied(conn: psycopg.Connection[Any], schema: str) -> set[str]:
    exists = conn.execute(
        "SELECT to_regclass(format('%%I.schema_migrations', %s::text)) IS NOT NULL", (schema,)
    ).fetchone()
    if not exists or not exists[0]:
        return set()
    rows = conn.execute(sql.SQL("SELECT name FROM {}.schema_migrations").format(sql.Identifier(schema))).fetchall()
    return {str(row[0]) for row in rows}


def pending(conn: psycopg.Connection[Any], schema: str, migrations: Sequence[Migration]) -> list[str]:
    """Names of ``migrations`` not yet applied to ``schema``."""
    applied = _applied(conn, schema)
    return [m.name for m in migrations if m.name not in applied]


def apply(conn: psycopg.Connection[Any], schema: str, migrations: Sequence[Migration]) -> list[str]:
    """Apply the missing ``migrations`` to ``schema`` in one transaction; return their names.

    Safe to run twice and from several processes at once: an advisory lock serialises
    migrators, and each one applies only what the previous ones have not.
    """
    with conn.transaction():
        conn.execute(_MIGRATION_LOCK)
        _ensure_bookkeeping(conn, schema)
        applied = _applied(conn, schema)
        done: list[str] = []
        conn.execute("SELECT set_config('search_path', %s, true)", (f'"{schema}", public',))
        for migration in migrations:
            if migration.name in applied:
                continue
            try:
                with conn.transaction():
                    conn.execute(migration.text.encode())
            except psycopg.Error as exc:
                raise MigrationError(f"migration {migration.name} failed on schema {schema}: {exc}") from exc
            conn.execute(
                sql.SQL("INSERT INTO {}.schema_migrations (name) VALUES (%s)").format(sql.Identifier(schema)),
                (migration.name,),
            )
            done.append(migration.name)
        return done


def create_database(dsn: str, name: str) -> bool:
    """Create the database ``name`` on the server of ``dsn`` unless it exists; ``True`` if it was created."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return False
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.errors.DuplicateDatabase:  # created meanwhile by another process
            return False
    return True
