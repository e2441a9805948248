"""The inbox (processed message ids), delivery attempts and dead letters of a service."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from . import retention
from .queries import query


def record(conn: psycopg.Connection[Any], schema: str, consumer: str, message_id: uuid.UUID) -> bool:
    """Record that ``consumer`` processes ``message_id``; ``False`` means it already did.

    Call it inside the transaction of the message's effect: the record then commits or
    rolls back with the effect. A concurrent delivery of the same id waits here until
    the first one's transaction ends, then sees it as a duplicate (or proceeds, if the
    first rolled back).
    """
    cur = conn.execute(query("record_inbox", schema), {"consumer": consumer, "message_id": message_id})
    return cur.rowcount == 1


def count_attempt(
    conn: psycopg.Connection[Any],
    schema: str,
    consumer: str,
    message_id: uuid.UUID,
    *,
    lock_timeout_ms: int | None = None,
) -> int:
    """Count one more delivery attempt of ``message_id`` and return the total.

    Call it in a transaction of its own (or in autocommit), before the work: the count
    survives a worker that is killed. That transaction commits asynchronously
    (``synchronous_commit = off``): a database crash may lose the last counts, which only
    delays parking a message that keeps killing its worker. While another delivery of
    the message is in its transaction, this waits for it to end, at most
    ``lock_timeout_ms`` (``None``: no limit), then raises ``LockNotAvailable`` having
    counted nothing.
    """
    row = conn.execute(query("count_attempt", schema), attempt_params(consumer, message_id, lock_timeout_ms)).fetchone()
    assert row is not None
    return int(row[0])


def attempt_params(
    consumer: str,
    message_id: uuid.UUID,
    lock_timeout_ms: int | None,
    *,
    alone: bool = True,
    copies: int = 1,
    deaths_before: int = 0,
) -> dict[str, Any]:
    """The parameters of ``count_attempt`` and ``record_inbox_and_lock`` (``None``: no lock timeout).

    ``alone``: count the delivery whatever the count holds; otherwise only while the count is
    below ``copies``, the copies of the message delivered so far (see ``count_attempt`` in
    ``sql/queries.sql``). ``deaths_before``: deliveries that died with their process
    uncounted, recorded if this is the message's first count.
    """
    timeout = f"{lock_timeout_ms}ms" if lock_timeout_ms is not None else "0"
    return {
        "consumer": consumer,
        "message_id": message_id,
        "lock_timeout": timeout,
        "alone": alone,
        "copies": copies,
        "deaths_before": deaths_before,
    }


def end_attempt(conn: psycopg.Connection[Any], schema: str, consumer: str, message_id: uuid.UUID) -> None:
    """Record that the counted delivery of ``message_id`` ended without committing: it did not die with its process.

    Call it once the step's transaction has rolled back, in a transaction of its own.
    """
    conn.execute(query("end_attempt", schema), {"consumer": consumer, "message_id": message_id})


def record_forgetting_attempts(
    conn: psycopg.Connection[Any], schema: str, consumer: str, message_id: uuid.UUID, *, wakeup: str | None = None
) -> psycopg.Cursor[Any]:
    """:func:`record` and :func:`forget_attempts` in one statement; the cursor's rowcount is 1 unless a duplicate.

    ``wakeup``: the transaction's ``estafeta.wakeup`` (``None``: the session's), set by the
    same statement (and so in the next two). In pipeline mode the rowcount is known once
    the pipeline has synced.
    """
    params = {"consumer": consumer, "message_id": message_id, "wakeup": wakeup}
    return conn.execute(query("record_inbox_forgetting_attempts", schema), params)


def record_first_delivery(
    conn: psycopg.Connection[Any],
    schema: str,
    consumer: str,
    message_id: uuid.UUID,
    *,
    lock_timeout_ms: int,
    wakeup: str | None = None,
) -> psycopg.Cursor[Any]:
    """:func:`record_forgetting_attempts` for an uncounted delivery: the insert waits at most ``lock_timeout_ms``.

    It waits only for a delivery of the same message still in its transaction (whose outcome
    decides whether this one is a duplicate), as the count would have; ``lock_timeout`` is set
    back for the rest of the transaction. The cursor's rowcount is 1 unless a duplicate (in
    pipeline mode, once the pipeline has synced).
    """
    params = {**attempt_params(consumer, message_id, lock_timeout_ms), "wakeup": wakeup}
    return conn.execute(query("record_inbox_first_delivery", schema), params)


def record_and_lock(
    conn: psycopg.Connection[Any],
    schema: str,
    consumer: str,
    message_id: uuid.UUID,
    key: str,
    *,
    lock_timeout_ms: int,
    wakeup: str | None = None,
) -> psycopg.Cursor[Any]:
    """:func:`record_forgetting_attempts`, then the advisory lock on ``key`` only if the record is new.

    One statement; the cursor's rowcount is 1 for a new message (the lock is then held until
    the transaction ends), 0 for a duplicate, which takes no lock and so never waits for
    its holder. ``lock_timeout_ms`` bounds the wait for a delivery of the same message still
    in flight and then for the lock (``LockNotAvailable``), and stays set for the rest of
    the transaction. In pipeline mode the rowcount is known once the pipeline has synced.
    """
    params = {**attempt_params(consumer, message_id, lock_timeout_ms), "key": key, "wakeup": wakeup}
    return conn.execute(query("record_inbox_and_lock", schema), params)


def forget_attempts(conn: psycopg.Connection[Any], schema: str, consumer: str, message_id: uuid.UUID) -> None:
    """Drop the attempt count of a message that reached its final outcome."""
    conn.execute(query("forget_attempts", schema), {"consumer": consumer, "message_id": message_id})


def dead_letter(
    conn: psycopg.Connection[Any],
    schema: str,
    consumer: str,
    message_id: str,
    message: dict[str, Any],
    reason: str,
) -> None:
    """Park a message that will not be processed, with the reason, for an operator."""
    conn.execute(
        query("insert_dead_letter", schema),
        {"consumer": consumer, "message_id": message_id, "message": Jsonb(message), "reason": reason},
    )


def count_dead_letters(conn: psycopg.Connection[Any], schema: str) -> int:
    """How many dead letters the service holds."""
    row = conn.execute(query("count_dead_letters", schema)).fetchone()
    assert row is not None
    return int(row[0])


def list_dead_letters(conn: psycopg.Connection[Any], schema: str, limit: int = 100) -> list[dict[str, Any]]:
    """The newest dead letters first."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("list_dead_letters", schema), {"limit": limit})
        return cur.fetchall()


def prune(conn: psycopg.Connection[Any], schema: str, older_than: timedelta, *, batch_size: int = 1000) -> int:
    """Delete inbox records older than ``older_than``, a batch at a time; return how many.

    Only safe once no duplicate of those messages can still arrive (relay re-publishes
    and broker redeliveries happen within minutes, not days). The record of a message
    still in the dead letters is kept as long as its dead letter.
    """
    return retention.prune(conn, schema, "inbox", older_than, batch_size=batch_size)
