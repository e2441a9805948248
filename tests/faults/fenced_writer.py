"""``python -m tests.faults.fenced_writer DSN LOCK_URL KEY TTL_MS PING_ID``: a lock holder that writes when told.

Takes the Redis lease on KEY (its token recorded in ``pingpong.fences``) inside a
transaction on DSN, prints ``held <token>``, then waits for a line on stdin. On that line it
writes its row (``pingpong.pings``, PING_ID), checks its token the way a step does before
its commit (``before_commit``), commits, and prints ``committed``; when the fence refuses
it, it prints ``refused <error>`` and its transaction rolls back. The nemesis cuts this
process from the lock server between the two lines, so that its lease expires and a
successor takes the key: the stale holder's write must be refused.
"""

from __future__ import annotations

import sys

from estafeta import Runtime, Settings
from estafeta_sql.errors import EstafetaError


def main() -> None:
    dsn, lock_url, key, ttl_ms, ping_id = sys.argv[1:6]
    runtime = Runtime(Settings(database_url=dsn, lock_url=lock_url, lock_ttl_ms=int(ttl_ms)))
    try:
        with (
            runtime.database("pingpong").transaction() as conn,
            runtime.locks.hold(conn, key, schema="pingpong", dsn=dsn) as held,
        ):
            print(f"held {held.token}", flush=True)
            sys.stdin.readline()
            conn.execute("INSERT INTO pingpong.pings (ping_id, sent_at) VALUES (%s, now())", (ping_id,))
            held.before_commit(conn)
        print("committed", flush=True)
    except EstafetaError as exc:
        print(f"refused {type(exc).__name__}: {exc}", flush=True)
    finally:
        runtime.close()


if __name__ == "__main__":
    main()
