"""Asynchronous replication: what a failover loses, and that an outbox row and its effect are lost together.

With an asynchronous standby a commit is acknowledged before the standby has it. The test
cuts the standby off its primary (its WAL receiver stopped), places orders the primary
acknowledges, crashes the primary and promotes the standby: those orders are gone. What
must never happen is half a step: an order and its saga without the command the saga sent
through the outbox, or that command without its order. One transaction, one WAL record
stream: the standby has either all of a transaction or none of it.
"""

from __future__ import annotations

import pytest

from ..helpers import scalar
from ..pg_servers import failover_dsn, private_postgres
from .processes import estafeta, service_env

pytestmark = pytest.mark.heavy

#: Orders of a prefix, their sagas, and the outbox rows those sagas wrote (their first command).
_ORDERS = "SELECT count(*) FROM orders.orders WHERE starts_with(customer_id, %s)"
_SAGAS = """SELECT count(*) FROM orders.saga_order s JOIN orders.orders o USING (order_id)
             WHERE starts_with(o.customer_id, %s)"""
_SAGAS_WITHOUT_OUTBOX = """SELECT count(*) FROM orders.saga_order s
                            WHERE NOT EXISTS (SELECT FROM orders.outbox x WHERE x.saga_id = s.saga_id)"""
_OUTBOX_WITHOUT_SAGA = """SELECT count(*) FROM orders.outbox x
                           WHERE NOT EXISTS (SELECT FROM orders.saga_order s WHERE s.saga_id = x.saga_id)"""


def _place(env: dict[str, str], prefix: str, count: int) -> None:
    place = ["orders", "place", "--count", str(count), "--amount", "100", "--quantity", "1"]
    done = estafeta(env, *place, "--customer", f"{prefix}c", "--sku", f"{prefix}s")
    assert done.returncode == 0, done.stderr  # acknowledged: the primary committed them


def test_a_failover_to_an_asynchronous_standby_loses_whole_steps_never_half_of_one() -> None:
    with private_postgres() as primary:
        standby = primary.standby(synchronous=False)
        # No relay runs: every outbox row a placement wrote stays, to be counted.
        env = service_env(failover_dsn(primary, standby), "stub://")
        assert estafeta(env, "migrate").returncode == 0
        _place(env, "kept-", 40)
        standby.replayed(primary)
        standby.stop_streaming()
        _place(env, "lost-", 40)  # acknowledged by the primary, never shipped
        with primary.connect() as conn:
            assert scalar(conn, _SAGAS, "lost-") == 40
        primary.stop("immediate")
        standby.promote()
        with standby.connect() as conn:
            # What asynchronous replication loses: commits the old primary acknowledged.
            assert scalar(conn, _ORDERS, "kept-") == scalar(conn, _SAGAS, "kept-") == 40
            assert scalar(conn, _ORDERS, "lost-") == 0
            # And never half a transaction: each saga with its command, each command with its saga.
            assert scalar(conn, "SELECT count(*) FROM orders.outbox") >= 40
            assert scalar(conn, _SAGAS_WITHOUT_OUTBOX) == 0
            assert scalar(conn, _OUTBOX_WITHOUT_SAGA) == 0
        # The system goes on from what the new primary has: the DSN naming both finds it.
        _place(env, "after-", 5)
        with standby.connect() as conn:
            assert scalar(conn, _ORDERS, "after-") == 5
