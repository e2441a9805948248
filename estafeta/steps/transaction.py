"""The fixed statements of a step's transaction, in two pipelines around the step's own work.

A delivery used to cost a round trip per statement: count the attempt (its own durable
commit), ``BEGIN``, the inbox record, the lock's timeout, the lock, the savepoint, the
work, the reply and its ``NOTIFY``, forgetting the count, ``COMMIT``. Only the work needs
the answers one at a time. So the statements before it go in one pipeline
(:func:`begin`), and those after it in another that ends with the ``COMMIT``
(:func:`committing`): a step without a lock or a reply of its own costs the round trips of
its work plus two. What the guarantees need is unchanged: the attempt is counted in a
transaction committed before the work (asynchronously: see ``count_attempt`` in
``sql/queries.sql``) unless the broker says the message reached no consumer before (a first
delivery on RabbitMQ: the redelivery after a kill counts it), and the inbox record, the
work, the outbox rows and the answer commit together, durably, before the message is
acknowledged.

A duplicate is answered by the first pipeline without waiting for the step's lock: the
PostgreSQL lock is part of the inbox record's statement and taken only for a new message
(``record_inbox_and_lock``). What a duplicate may wait for is a delivery of the same message
still in its transaction (its outcome decides whether this one is a duplicate), at most the
lock timeout; giving up then counts no delivery (the count's own transaction rolls back).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import attrs
import psycopg
from psycopg.pq import ExecStatus, TransactionStatus
from psycopg.rows import dict_row

from estafeta_sql import inbox, plan
from estafeta_sql.errors import DatabaseError
from estafeta_sql.queries import query

#: The savepoint a business failure rolls back to: the step's work, not its inbox record.
SAVEPOINT = "estafeta_step"
#: The savepoint a saga's local step runs in, inside the orchestrator step's transaction.
LOCAL_SAVEPOINT = "estafeta_local_step"


@attrs.frozen
class Opened:
    """What the first pipeline found."""

    #: Deliveries of the message so far, this one included.
    attempts: int
    #: ``False``: the inbox already had the message (a duplicate).
    first: bool
    #: An earlier delivery died unfinished and this one was not counted: it must run alone
    #: (``begin``'s ``alone``). Its transaction is to be rolled back, its work not done.
    suspect: bool = False
    #: A hand-off found its outbox row gone or held (``begin``'s ``handoff_from``): a relay
    #: publishes it. Its transaction is to be rolled back, its work not done.
    relayed: bool = False
    #: The rows of ``begin``'s ``opening`` statement (dicts), if it was given one.
    opening: list[dict[str, Any]] | None = None
    #: Deliveries of the message before this one that died with their process (started,
    #: counted, and neither committed nor ended by an error: see ``count_attempt``).
    deaths: int = 0


@attrs.frozen
class Uncounted:
    """The deliveries of a message that no count holds (``estafeta.steps.delivery._uncounted`` says which)."""

    #: This delivery goes uncounted: the broker says no consumer had this copy before.
    this_one: bool = False
    #: Earlier deliveries not counted: Dramatiq's retries (each a copy first-delivered again),
    #: and a redelivery's own first delivery.
    before: int = 0
    #: This is a redelivery of a copy whose first delivery went uncounted: that one ended
    #: without an acknowledgement, with its process (its death is recorded at the first count).
    redelivered: bool = False


def begin(
    conn: psycopg.Connection[Any],
    schema: str,
    consumer: str,
    message_id: uuid.UUID,
    lock_key: str | None,
    *,
    lock_timeout_ms: int,
    wake_after_commit: bool = False,
    uncounted: Uncounted = Uncounted(),
    alone: bool = True,
    copies: int = 1,
    handoff_from: str | None = None,
    opening: plan.Statement | None = None,
) -> Opened:
    """Count the delivery, then open the step's transaction, in one round trip.

    ``conn`` must be idle: in autocommit, or not (Django's connection in a step, see
    ``estafeta.django.step_connections``: psycopg opens the count's transaction itself, and
    a ``BEGIN`` of ours would be a warning in the server's log). On return it is inside the step's
    transaction, after the inbox record (which forgot the count), the PostgreSQL lock on
    ``lock_key`` (if given, and only if the message is new: a duplicate takes none) and the
    savepoint. ``lock_timeout_ms`` bounds every wait: for a delivery of the same message
    still in flight, then for the lock. On an error (``LockNotAvailable``) the transaction
    is left for the caller to roll back; the count was committed before it, unless the
    count itself gave up waiting. ``wake_after_commit``: the transaction sends no NOTIFY
    (``estafeta.wakeup = 'after-commit'``, see ``estafeta.messaging.wakeups``); the caller wakes the
    relays and projectors once it has committed.

    ``uncounted.this_one``: the broker says no consumer has had this copy of the message
    before (RabbitMQ's ``redelivered`` flag is clear), so the delivery is not counted: its
    transaction, a row written and deleted, are skipped. Should it kill its worker, RabbitMQ
    hands it on marked redelivered, and that delivery is counted and reports one more: the
    first. ``uncounted.before`` is added to the count returned.

    The delivery counted is marked unfinished; ``Opened.deaths`` says how many counted before
    it never finished (died with their process: ``estafeta.steps.worker_deaths``).

    ``alone`` is ``False`` for a delivery sharing its process with others: it is counted only
    if the count is below ``copies`` (the copies of the message Dramatiq sent: its retries
    + 1). Otherwise an earlier delivery died unfinished, of this message or of one beside
    it, and the delivery comes back ``suspect``, uncounted, to be run again alone.

    ``handoff_from``: the message is a hand-off (``estafeta.messaging.handoff``) whose row waits in
    that schema's outbox; the transaction deletes it first (``claim_handoff``), or comes
    back ``relayed`` if a relay holds it or has published it, or an older row of its key is
    still to go.

    ``opening``: a statement of the step's own (its row, locked), run after the savepoint
    in the same round trip; its rows come back in ``Opened.opening``. A duplicate runs it too.
    """
    opened = None
    with conn.pipeline():
        if conn.autocommit:
            conn.execute("BEGIN")
        if uncounted.this_one:
            counted = None
        else:
            params = inbox.attempt_params(
                consumer,
                message_id,
                lock_timeout_ms,
                alone=alone,
                copies=copies,
                deaths_before=int(uncounted.redelivered),
            )
            counted = conn.execute(query("count_attempt", schema), params)
            conn.execute("COMMIT")
            conn.execute("BEGIN")
        handed = None
        if handoff_from is not None:
            handed = conn.execute(query("claim_handoff", handoff_from), {"message_id": message_id})
        # The inbox record's statement sets the transaction's wake-up policy too.
        wakeup = "after-commit" if wake_after_commit else None
        if lock_key is None and uncounted.this_one:
            recorded = inbox.record_first_delivery(
                conn, schema, consumer, message_id, lock_timeout_ms=lock_timeout_ms, wakeup=wakeup
            )
        elif lock_key is None:
            recorded = inbox.record_forgetting_attempts(conn, schema, consumer, message_id, wakeup=wakeup)
        else:
            recorded = inbox.record_and_lock(
                conn, schema, consumer, message_id, lock_key, lock_timeout_ms=lock_timeout_ms, wakeup=wakeup
            )
        conn.execute(f"SAVEPOINT {SAVEPOINT}")
        if opening is not None:
            opened = run_opening(conn, opening)
    rows = opened_rows(opened) if opened is not None else None
    if handed is not None and handed.rowcount != 1:
        return Opened(attempts=0, first=False, relayed=True)
    attempts, deaths = 1, 0
    if counted is not None:
        row = counted.fetchone()
        if row is None:
            return Opened(attempts=0, first=recorded.rowcount == 1, suspect=True)
        attempts, deaths = int(row[0]), int(row[1])
    return Opened(attempts=attempts + uncounted.before, first=recorded.rowcount == 1, opening=rows, deaths=deaths)


def run_opening(conn: psycopg.Connection[Any], opening: plan.Statement) -> psycopg.Cursor[dict[str, Any]]:
    """Execute a step's opening statement (in the caller's pipeline); :func:`opened_rows` reads its rows."""
    opened = conn.cursor(row_factory=dict_row)
    plan.json_as_python(opened)
    opened.execute(opening.query, opening.params)
    return opened


def opened_rows(opened: psycopg.Cursor[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of :func:`run_opening`'s statement (none if it returns none), once its pipeline has synced."""
    rows = opened.fetchall() if opened.description else []
    opened.close()
    return rows


def roll_back_work(conn: psycopg.Connection[Any], savepoint: str = SAVEPOINT) -> None:
    """Undo the step's own work (a business failure), keeping the inbox record and the lock.

    ``savepoint``: another savepoint to go back to (a saga's local step's, ``LOCAL_SAVEPOINT``).

    Sent to libpq directly (``conn.pgconn``), not through ``conn.execute``: psycopg empties
    the connection's prepared statements (``DEALLOCATE ALL``) after any command that answers
    ``ROLLBACK``, and ``ROLLBACK TO SAVEPOINT`` answers so. Where orders are refused now and
    then, a connection's statements were then parsed and planned again for their next ten
    executions (five unprepared, five custom plans) more often than not: 12% of PostgreSQL's
    CPU in ``bench.sagas`` (measured with ``bench.pg_profile``). Rolling back to a savepoint drops
    no prepared statement on the server; only a step that changed a table's columns inside
    the savepoint could find a statement prepared after that change failing (``cached plan
    must not change result type``), and steps do not change tables.
    """
    with conn.lock:
        result = conn.pgconn.exec_(f"ROLLBACK TO SAVEPOINT {savepoint}".encode())
    if result.status != ExecStatus.COMMAND_OK:
        raise psycopg.errors.error_from_result(result, encoding=conn.info.encoding)


@contextlib.contextmanager
def committing(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Pipeline what the block executes, then ``COMMIT``; raise unless the commit committed.

    Statements in the block must not need their results before the commit (a fence check
    that does waits for its own answer, which is allowed: the pipeline syncs there).
    """
    with conn.pipeline():
        yield
        committed = conn.execute("COMMIT")
    if committed.statusmessage != "COMMIT":
        # PostgreSQL answers a COMMIT of a failed transaction with ROLLBACK.
        raise DatabaseError(f"the step's transaction did not commit ({committed.statusmessage})")


def commit(conn: psycopg.Connection[Any]) -> None:
    """End the transaction with a ``COMMIT`` (nothing else to send)."""
    with committing(conn):
        pass


@contextlib.contextmanager
def rolled_back_on_error(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Roll back whatever transaction the block leaves open when it raises; the connection goes back clean."""
    try:
        yield
    except BaseException:
        if not conn.closed and conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")
        raise
