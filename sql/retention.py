"""Pruning a service's messaging tables: old rows deleted a batch at a time, never waiting on a held row.

Each batch is one statement; on an autocommit connection each is a short transaction of
its own, so pruning a large backlog never holds many row locks, nor one lock for long.
The statements skip rows another transaction holds (``FOR UPDATE SKIP LOCKED``): a
delivery in progress, a guarded transaction between its fence check and its commit.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg

from .queries import query

#: The tables of every service schema that grow until pruned, in the order they are pruned
#: (dead letters first: an inbox record is kept while its dead letter is).
TABLES = ("dead_letters", "inbox", "inbox_attempts", "fences")


def prune(
    conn: psycopg.Connection[Any],
    schema: str,
    table: str,
    older_than: timedelta,
    *,
    batch_size: int = 1000,
    dry_run: bool = False,
) -> int:
    """Delete ``table``'s rows older than ``older_than``; return how many (with ``dry_run``: would)."""
    if table not in TABLES:
        raise ValueError(f"{table!r} is not a prunable table ({', '.join(TABLES)})")
    params = {"older_than": older_than, "batch": batch_size}
    if dry_run:
        return count(conn, query(f"count_prunable_{table}", schema), params)
    return delete_in_batches(conn, query(f"prune_{table}", schema), params)


def count(conn: psycopg.Connection[Any], statement: bytes, params: dict[str, Any]) -> int:
    """The count a ``SELECT count(*)`` statement returns."""
    row = conn.execute(statement, params).fetchone()
    return int(row[0]) if row else 0


def delete_in_batches(conn: psycopg.Connection[Any], statement: bytes, params: dict[str, Any]) -> int:
    """Run a ``DELETE`` bounded by ``params["batch"]`` until it deletes fewer; return the total."""
    total = 0
    while True:
        deleted = conn.execute(statement, params).rowcount
        total += deleted
        if deleted < params["batch"]:
            return total
