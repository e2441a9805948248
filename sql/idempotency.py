"""The Idempotency-Key store: one record per (client, key), in the schema of the service it serves.

Every function runs on the caller's connection and inside the caller's transaction, so a
record commits or rolls back with the request's business change.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import attrs
import psycopg
from psycopg.types.json import Jsonb

from . import plan, queries

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


def query(name: str, schema: str) -> bytes:
    """The query ``name`` with ``{schema}`` bound to ``schema`` as an identifier."""
    return queries.query(name, schema, "idempotency.sql")


def claim(
    conn: psycopg.Connection[Any], schema: str, *, client: str, key: str, lock_name: str
) -> tuple[StoredKey | None, bool]:
    """The unexpired record of ``client``'s ``key`` if one is visible; else whether the lock ``lock_name`` was taken.

    Returns ``(record, True)``, ``(None, True)`` (the key is this transaction's now) or
    ``(None, False)`` (another transaction holds it).
    """
    return plan.run(conn, claim_plan(schema, client=client, key=key, lock_name=lock_name))


def claim_plan(schema: str, *, client: str, key: str, lock_name: str) -> plan.Plan[tuple[StoredKey | None, bool]]:
    """:func:`claim`, as a plan."""
    params = {"client": client, "key": key, "lock_name": lock_name}
    result = yield plan.Statement(query("claim_key", schema), params, plan.Fetch.ROWS)
    row = result.first()
    assert row is not None
    fingerprint, status, headers, body, locked = row
    if fingerprint is None:
        return None, bool(locked)
    pairs = tuple((str(n), str(v)) for n, v in headers)
    return StoredKey(str(fingerprint), int(status), pairs, bytes(body)), True


def store(conn: psycopg.Connection[Any], schema: str, **record: Any) -> bool:
    """Record the response to a client's key (:func:`store_plan`); ``False`` if an unexpired record exists."""
    return plan.run(conn, store_plan(schema, **record))


def store_plan(
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
) -> plan.Plan[bool]:
    """Record the response to ``client``'s ``key`` until ``now() + ttl``; ``False`` if an unexpired one exists.

    An existing record is seen even if it committed after the caller's last snapshot.
    """
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
    result = yield plan.Statement(query("store_key", schema), params, plan.Fetch.ROWCOUNT)
    return bool(result.rowcount == 1)


def prune(conn: psycopg.Connection[Any], schema: str, batch_size: int) -> int:
    """Delete up to ``batch_size`` expired records; return how many."""
    return conn.execute(query("prune_keys", schema), {"batch_size": batch_size}).rowcount
