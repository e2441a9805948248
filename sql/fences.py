"""Fencing tokens in PostgreSQL: the newest token seen per lock key, in a service's schema.

A lease lock (Redis) can expire while its holder is paused (GC, SIGSTOP, a slow network)
and be taken by someone else; the paused holder then wakes up believing it still holds
it. The protocol here makes its writes fail instead:

1. right after acquiring the lock, and before reading anything it will act on, the
   holder records its token with :func:`advance`, in a transaction of its own that
   commits at once (so no row lock is held while it works);
2. its guarded transaction ends with :func:`check`, which re-reads the key's row
   ``FOR SHARE`` and raises :class:`~estafeta_sql.errors.StaleFencingToken` if a newer token
   was recorded since; the transaction then rolls back.

Between the check and the commit the share lock makes a successor's :func:`advance`
wait, so a successor never reads data that a stale holder is about to commit. Together:
two guarded transactions on the same key that both commit never overlap, whatever the
leases did. Tokens only need to grow for successors to get in; a token that does not
grow is refused by :func:`advance`, never let through.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg

from . import retention
from .errors import StaleFencingToken
from .queries import query


def advance(
    conn: psycopg.Connection[Any], schema: str, key: str, token: int, *, lock_timeout_ms: int = 5000
) -> int | None:
    """Record ``token`` as the newest for ``key``; ``None`` if accepted, else the newer token seen.

    Call it on an autocommit connection (it must commit before the guarded transaction
    reads). It waits, up to ``lock_timeout_ms``, for a guarded transaction that is between
    its :func:`check` and its commit; past that, psycopg raises ``LockNotAvailable``.
    """
    params = {"key": key, "token": token, "lock_timeout": f"{lock_timeout_ms}ms"}
    row = conn.execute(query("advance_fence", schema), params).fetchone()
    if row is not None:
        return None
    newest = conn.execute(query("read_fence", schema), {"key": key}).fetchone()
    return int(newest[0]) if newest else token


def check(conn: psycopg.Connection[Any], schema: str, key: str, token: int, *, lock_timeout_ms: int = 5000) -> None:
    """Raise :class:`StaleFencingToken` unless ``token`` is still the newest for ``key``.

    Make it the last statement of the guarded transaction, just before its commit. It
    sets the transaction's ``lock_timeout`` (only the commit follows).
    """
    params = {"key": key, "lock_timeout": f"{lock_timeout_ms}ms"}
    row = conn.execute(query("check_fence", schema), params).fetchone()
    newest = int(row[0]) if row else None
    if newest != token:
        seen = f"token {newest} was recorded since" if newest is not None else "its fence row is gone"
        raise StaleFencingToken(
            f"lock {key!r}: fencing token {token} is stale ({seen} in {schema}.fences): a newer holder "
            "took the lock after this one's lease expired; its transaction is rolled back"
        )


def newest(conn: psycopg.Connection[Any], schema: str, key: str) -> int | None:
    """The newest token recorded for ``key``, if any."""
    row = conn.execute(query("read_fence", schema), {"key": key}).fetchone()
    return int(row[0]) if row else None


def prune(conn: psycopg.Connection[Any], schema: str, older_than: timedelta, *, batch_size: int = 1000) -> int:
    """Forget the tokens of keys not locked for ``older_than``; return how many rows went.

    Always safe: a holder whose row was pruned mid-flight is refused at its check (its
    row is gone, or holds a newer token), and a holder that records its token afterwards
    reads what the earlier holders committed. Rows a guarded transaction is checking
    right now are skipped, never waited for.
    """
    return retention.prune(conn, schema, "fences", older_than, batch_size=batch_size)
