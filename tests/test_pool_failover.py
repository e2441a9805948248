"""A pool whose server crashed or failed over: one failed transaction, then new connections (not one per idle one)."""

from __future__ import annotations

import threading
import time

import pytest

from estafeta_sql.errors import DatabaseUnavailable
from estafeta_sql.pool import Database

from .pg_servers import failover_dsn, private_postgres


def _fill(database: Database, connections: int) -> None:
    """Make the pool hold ``connections`` idle connections (each used once, at the same time)."""
    barrier = threading.Barrier(connections)

    def use() -> None:
        with database.connection() as conn:
            conn.execute("SELECT 1")
            barrier.wait(10)

    threads = [threading.Thread(target=use) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert database.pool.get_stats()["pool_size"] >= connections


def _first_success(database: Database, timeout: float = 60) -> int:
    """Run a write until it commits; how many attempts failed with :class:`DatabaseUnavailable` first."""
    failures = 0
    deadline = time.monotonic() + timeout
    while True:
        try:
            with database.transaction() as conn:
                conn.execute("CREATE TABLE IF NOT EXISTS after_failover (n int)")
                conn.execute("INSERT INTO after_failover VALUES (1)")
            return failures
        except DatabaseUnavailable:
            failures += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.parametrize("crash", ["restart", pytest.param("failover", marks=pytest.mark.heavy)])
def test_a_crashed_server_costs_one_failed_transaction_not_one_per_pooled_connection(crash: str) -> None:
    with private_postgres() as primary:
        standby = primary.standby(synchronous=True) if crash == "failover" else None
        dsn = failover_dsn(primary, standby) if standby else primary.dsn()
        database = Database(dsn, min_size=1, max_size=6, timeout=30)
        try:
            _fill(database, 6)
            primary.stop("immediate")
            if standby is not None:
                standby.promote()
            else:
                primary.start()
            # Every idle connection is dead. The first transaction finds out; after it the
            # pool has dropped the others and opens new ones to whichever server writes now.
            assert _first_success(database) == 1
        finally:
            database.close()
