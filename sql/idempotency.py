"""The Idempotency-Key store: one record per (client, key), in the schema of the service it serves.

Every function runs on the caller's connection and inside the caller's transaction, so a
record commits or rolls back with the request's business change.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import attrs
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from . import queries

#: The directory of ``sql/migrations`` holding the table (``Service.use_builtin_migrations``).
MIGRATIONS = "_idempotency"


@attrs.frozen
class StoredKey:
    """A key's record: the fingerprint of the request that made it and the response it got."""

    fingerprint: str
    status: int
    #: The response's headers, as (name, value) pairs.
    headers: tuple[tuple[str, str], ...]
    body: bytes


def names() -> list[str]:
    """Every query name defined in ``idempotency.sql``."""
    return sorted(queries.parse("idempotency.sql"))


@functools.cache
def query(name: str, schema: str) -> sql.Composed:
    """The query ``name`` with ``{schema}`` bound to ``schema`` as an identifier."""
    return sql.SQL(queries.body("idempotency.sql", name)).format(schema=sql.Identifier(schema))


def try_lock(conn: psycopg.Connection[Any], schema: str, lock_name: str) -> bool:
    """Take the transaction-scoped lock ``lock_name`` if nobody holds it; ``False`` if somebody does."""
    row = conn.execute(query("try_lock_key", schema), {"lock_name": lock_name}).fetchone()
    return bool(row and row[0])


def find(conn: psycopg.Connection[Any], schema: str, client: str, key: str) -> StoredKey | None:
    """The unexpired record of ``client``'s ``key``, if there is one."""
    row = conn.execute(query("find_key", schema), {"client": client, "key": key}).fetchone()
    if row is None:
        return None
    fingerprint, status, headers, body = row
    return StoredKey(str(fingerprint), int(status), tuple((str(n), str(v)) for n, v in headers), bytes(body))


def store(
    conn: psycopg.Connection[Any],
    schema: str,
    *,
    client: str,
    key: str,
    fingerprint: str,
    method: str,
    target: str,
    status: int,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    ttl: timedelta,
) -> bool:
    """Record the response to ``client``'s ``key`` until ``now() + ttl``; ``False`` if an unexpired one exists."""
    params = {
        "client": client,
        "key": key,
        "fingerprint": fingerprint,
        "method": method,
        "target": target,
        "status": status,
        "headers": Jsonb([list(pair) for pair in headers]),
        "body": body,
        "ttl": ttl,
    }
    return conn.execute(query("store_key", schema), params).fetchone() is not None


def prune(conn: psycopg.Connection[Any], schema: str, batch_size: int) -> int:
    """Delete up to ``batch_size`` expired records, oldest first; return how many."""
    return conn.execute(query("prune_keys", schema), {"batch_size": batch_size}).rowcount
