"""``python -m tests.lock_holder DSN LOCK_URL KEY TTL_MS``: hold KEY inside a transaction until killed.

Prints ``held`` once the lock is taken; a test then kills this process with SIGKILL.
"""

from __future__ import annotations

import sys
import time

from estafeta import Runtime, Settings


def main() -> None:
    dsn, lock_url, key, ttl_ms = sys.argv[1:5]
    runtime = Runtime(Settings(database_url=dsn, lock_url=lock_url, lock_ttl_ms=int(ttl_ms)))
    with (
        runtime.database("pingpong").transaction() as conn,
        runtime.locks.hold(conn, key, schema="pingpong", dsn=dsn),
    ):
        print("held", flush=True)
        time.sleep(600)


if __name__ == "__main__":
    main()
