"""The outbox store: rows written inside a business transaction, drained by the relay.

What operators and apps ask of an outbox besides that (what waits, cancel, reschedule,
retry) is in :mod:`estafeta_sql.outbox_admin`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from . import plan
from .errors import StandbysBehind
from .queries import query

#: The channel a committed outbox write NOTIFYs (payload: the schema) to wake relays.
WAKE_CHANNEL = "estafeta_outbox"


@attrs.frozen
class OutgoingMessage:
    """A message to write into a service's outbox."""

    #: The Dramatiq message id the relay will publish with; consumers deduplicate on it.
    message_id: uuid.UUID
    #: The Dramatiq queue and actor that will receive it.
    queue_name: str
    actor_name: str
    #: Dramatiq's ``args``, ``kwargs`` and ``options``, JSON-ready.
    args: Sequence[Any] = ()
    kwargs: dict[str, Any] = attrs.field(factory=dict)
    options: dict[str, Any] = attrs.field(factory=dict)
    #: Rows with the same key reach the broker in commit order.
    ordering_key: str | None = None
    saga_id: uuid.UUID | None = None
    #: Not published before this much time has passed after the commit.
    delay: timedelta = timedelta(0)
    #: Not published before this instant (by the schema's clock); overrides ``delay``.
    at: datetime | None = None
    #: What the message is: its command or event class, ``module.Class`` (``None``: unknown).
    message_type: str | None = None


@attrs.frozen
class OutboxRow:
    """A row the relay claimed."""

    #: The row's id (also its commit-order position within one key).
    id: int
    message_id: uuid.UUID
    queue_name: str
    actor_name: str
    #: ``{"args": [...], "kwargs": {...}, "options": {...}}``.
    message: dict[str, Any]
    ordering_key: str | None
    saga_id: uuid.UUID | None
    created_at: datetime
    #: Failed publishes so far.
    attempts: int
    #: Seconds since the row was written, by the database's clock, when it was claimed.
    age_seconds: float = 0.0

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> OutboxRow:
        """Build from a ``dict_row`` of the claim queries."""
        return cls(**row)


def insert(conn: psycopg.Connection[Any], schema: str, message: OutgoingMessage) -> None:
    """Write ``message`` into ``schema``'s outbox on ``conn``, inside the caller's transaction.

    The caller's commit makes it visible to the relay; a rollback discards it with the
    rest of the transaction. The relay is woken by a NOTIFY that PostgreSQL delivers
    only at commit.
    """
    plan.execute(conn, insert_statement(schema, message))


def insert_statement(schema: str, message: OutgoingMessage) -> plan.Statement:
    """The statement :func:`insert` executes: for a plan that any driver runs (``estafeta_sql.plan``)."""
    body = {"args": list(message.args), "kwargs": message.kwargs, "options": message.options}
    params = {
        "message_id": message.message_id,
        "queue_name": message.queue_name,
        "actor_name": message.actor_name,
        "message": Jsonb(body),
        "ordering_key": message.ordering_key,
        "saga_id": message.saga_id,
        "delay": message.delay,
        "at": message.at,
        "message_type": message.message_type,
        "channel": WAKE_CHANNEL,
        "schema_name": schema,
    }
    return plan.Statement(query("insert_outbox", schema), params)


def handoff_statement(schema: str, insert: plan.Statement, lease: timedelta) -> plan.Statement:
    """``insert`` (an :func:`insert_statement` of ``schema``) as a hand-off's leased row.

    No relay claims it before ``lease`` ends: see ``insert_outbox_handoff`` and
    ``claim_handoff`` in ``sql/queries.sql``.
    """
    assert isinstance(insert.params, dict)
    return plan.Statement(query("insert_outbox_handoff", schema), {**insert.params, "lease": lease})


def release_handoff(conn: psycopg.Connection[Any], schema: str, message_id: uuid.UUID) -> None:
    """Make a hand-off's leased row due now, for the relays (the hand-off did not take it)."""
    conn.execute(query("release_handoff", schema), {"message_id": message_id})


def claim_batch(conn: psycopg.Connection[Any], schema: str, limit: int) -> list[OutboxRow]:
    """Lock up to ``limit`` due rows that may be published now, in id order.

    Per key, the rows returned are the key's oldest rows, contiguous, none of them behind
    a row that failed, waits for a retry, or is held by another relay: publishing them
    in the order returned keeps each key's commit order, whichever relays run. A key whose
    head row failed or backs off holds back its own rows only: the heads of every other key
    and the keyless rows are found however many of its rows come first. Must run inside a
    transaction; the rows stay locked (invisible to other relays' claims) until it ends,
    and it commits asynchronously (``synchronous_commit = off``, see below).
    """
    # Rows in id order, straight off the pending index: never "fetch every pending row
    # and sort", which a planner without statistics (a backlog just written) would pick,
    # checking each row's key every batch. The batch's transaction (which deletes what was
    # published) commits without waiting for the WAL flush: a delete lost in a database
    # crash only means those rows are published again, and their receivers' inboxes absorb
    # the copies. Both settings end with the transaction.
    #
    # The settings, the heads and how many rows are due (counting one past a full batch) go
    # in one round trip (with the caller's BEGIN, if it pipelines: brokers.relay does).
    window = max(4 * limit, 1000)
    with conn.cursor(row_factory=dict_row) as claimed:
        with conn.pipeline():
            conn.execute("SELECT set_config('enable_sort', 'off', true), set_config('synchronous_commit', 'off', true)")
            claimed.execute(query("claim_heads", schema), {"limit": limit, "window": window})
            counted = conn.execute(query("due_in_window", schema), {"window": limit + 1})
        heads = [OutboxRow.from_row(row) for row in claimed.fetchall()]
    if len(heads) >= limit:
        return heads
    # Every due row a head this claim holds: no key has a row to follow its head, and none
    # is hidden past the window. (The count comes after the claim: a row committed or held
    # by another relay in between only sends this claim the long way; a follower due at the
    # claim is still there, counted.)
    due = _count(counted)
    if due == len(heads):
        return heads
    # A window full of rows that cannot go now (a blocked key's backlog, rows other relays
    # hold) may hide heads of other keys past it; fewer due rows than a batch fill none.
    hidden = due > limit and _count(conn.execute(query("due_in_window", schema), {"window": window})) >= window
    if not hidden and all(row.ordering_key is None for row in heads):
        return heads
    # The next queries sort a few candidates; without sorting, the planner would walk the
    # whole outbox in id order to avoid that.
    conn.execute("SELECT set_config('enable_sort', 'on', true)")
    batch = _with_followers(conn, schema, heads, [], limit)
    if hidden and len(batch) < limit:
        params = {"limit": limit - len(batch), "claimed": [row.id for row in batch]}
        more = _claim(conn, "claim_heads_past_window", schema, params)
        batch = _with_followers(conn, schema, more, batch, limit)
    return batch


def _held_back(conn: psycopg.Connection[Any], schema: str, rows: list[OutboxRow], batch: list[OutboxRow]) -> set[int]:
    """Those of ``rows`` whose key has an older row outside ``batch`` (skipped: someone else locked it)."""
    params = {"ids": [r.id for r in rows], "keys": [r.ordering_key for r in rows], "batch": [r.id for r in batch]}
    return {row[0] for row in conn.execute(query("held_back", schema), params).fetchall()}


def _with_followers(
    conn: psycopg.Connection[Any], schema: str, heads: list[OutboxRow], batch: list[OutboxRow], limit: int
) -> list[OutboxRow]:
    """``batch`` with ``heads`` and as many of their keys' next rows as fit in ``limit``, in id order."""
    claimed = batch + heads
    keys = sorted({row.ordering_key for row in heads if row.ordering_key is not None})
    if keys and len(claimed) < limit:
        params = {"keys": keys, "heads": [row.id for row in claimed], "limit": limit - len(claimed)}
        followers = _claim(conn, "claim_followers", schema, params)
        if followers:
            held = _held_back(conn, schema, followers, claimed + followers)
            claimed += [row for row in followers if row.id not in held]
    return sorted(claimed, key=lambda row: row.id)


def _count(cursor: psycopg.Cursor[Any]) -> int:
    row = cursor.fetchone()
    return int(row[0]) if row is not None else 0


def _claim(conn: psycopg.Connection[Any], name: str, schema: str, params: dict[str, Any]) -> list[OutboxRow]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query(name, schema), params)
        return [OutboxRow.from_row(row) for row in cur.fetchall()]


def wait_for_standbys(conn: psycopg.Connection[Any], standbys: int, timeout: float) -> None:
    """Return once ``standbys`` standbys have flushed every commit ``conn``'s transaction can see.

    Called after a claim, in the claim's transaction: every row it claimed was committed
    (and, with ``synchronous_commit`` on, flushed) before the WAL flush position read now,
    and a standby that has flushed up to it keeps those commits through a promotion.
    Raises :class:`StandbysBehind` after ``timeout`` seconds.
    """
    row = conn.execute(query("current_wal_position", "public")).fetchone()
    target = row[0] if row else None
    deadline = time.monotonic() + timeout
    pause = 0.002
    while True:
        found = conn.execute(query("standbys_flushed_to", "public"), {"target": target}).fetchone()
        caught_up, unseen = (int(found[0]), int(found[1])) if found else (0, 0)
        if caught_up >= standbys:
            return
        if time.monotonic() >= deadline:
            hint = f"; {unseen} connected standby(s) show no position: grant pg_monitor to this user" if unseen else ""
            raise StandbysBehind(
                f"{caught_up} of the {standbys} standby(s) the relay waits for (ESTAFETA_RELAY_WAIT_STANDBYS)"
                f" have flushed up to {target} after {timeout:g} s: down or lagging? (pg_stat_replication{hint})"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


@attrs.frozen
class Due:
    """What :func:`due_now` found in one outbox."""

    #: A pending row is due now.
    now: bool
    #: If none is: seconds until the next pending row falls due (``None``: there is none).
    next_in: float | None


def due_now(conn: psycopg.Connection[Any], schemas: Sequence[str]) -> dict[str, Due]:
    """For each outbox of ``schemas`` (all on ``conn``'s database), in one round trip: a row due now, or when next."""
    with conn.pipeline():
        asked = {schema: conn.execute(query("due_probe", schema)) for schema in schemas}
    found = {}
    for schema, cursor in asked.items():
        any_due, next_in = cursor.fetchone() or (False, None)  # the probe's one row
        found[schema] = Due(bool(any_due), None if next_in is None else max(float(next_in), 0.0))
    return found


def seconds_until_next_due(conn: psycopg.Connection[Any], schema: str) -> float | None:
    """Seconds until the next delayed or backing-off row becomes due; ``None`` if there is none."""
    row = conn.execute(query("next_due", schema)).fetchone()
    return None if row is None or row[0] is None else max(float(row[0]), 0.0)


def delete_published(conn: psycopg.Connection[Any], schema: str, ids: Sequence[int]) -> None:
    """Delete rows the broker confirmed."""
    if ids:
        conn.execute(query("delete_published", schema), {"ids": list(ids)})


def record_publish_failure(
    conn: psycopg.Connection[Any],
    schema: str,
    ids: Sequence[int],
    error: str,
    *,
    max_attempts: int | None,
    backoff: timedelta,
) -> None:
    """Count a failed publish of ``ids``; a row refused ``max_attempts`` times becomes ``failed``.

    ``max_attempts=None``: the broker turned the rows away for now (a deferral): counted for
    their backoff, never toward parking them.
    """
    if ids:
        conn.execute(
            query("record_publish_failure", schema),
            {"ids": list(ids), "error": error, "max_attempts": max_attempts, "backoff": backoff},
        )
