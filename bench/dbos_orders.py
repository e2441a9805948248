"""The order saga as a DBOS Transact workflow: the peer ``bench.sagas`` measures estafeta's saga against.

Run by ``python -m bench.dbos_orders`` (one DBOS executor per process; bench/peer_dbos.py starts
as many as estafeta has worker processes) with ``BENCH_DBOS_SYSTEM_URL`` (DBOS's own system
database), ``BENCH_DBOS_APP_URL`` (the benchmark's database, whose order-system tables the
steps write) and ``BENCH_DBOS_CONCURRENCY`` (workflows at once per process). It prints
``ready`` once it listens to the queue.

The workflow does what estafeta's order saga does, against the same tables: charge the
payment (the account's ledger event, its projection and the payment row), reserve the
stock, confirm the order, notify the customer; a refusal (no money, no stock) compensates
what was done (refund, cancel) and notifies the cancellation. Each step is a DBOS datasource
transaction: its writes and DBOS's checkpoint of its result commit together, as an
estafeta step's writes and its inbox row do.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from typing import Any, Final

import sqlalchemy as sa
from dbos import DBOS, DBOSConfig, SQLAlchemyDatasource

from .peer_dbos import APP_VERSION, QUEUE, WORKFLOW

#: How often each executor polls the queue (DBOS queues poll; the default is 1 s).
POLL_SECONDS = 0.05
#: estafeta's steps run in READ COMMITTED with row locks; DBOS's default is SERIALIZABLE.
ISOLATION: Final = "READ COMMITTED"

_datasource = SQLAlchemyDatasource.create(
    os.environ.get("BENCH_DBOS_APP_URL", "postgresql://localhost/unset"),
    engine_kwargs={"pool_size": int(os.environ.get("BENCH_DBOS_CONCURRENCY", "8")) + 2},
    run_migrations=False,
)


def _one(query: str, **params: Any) -> Any:
    return _datasource.sql_session().execute(sa.text(query), params).first()


def _run(query: str, **params: Any) -> int:
    return int(_datasource.sql_session().execute(sa.text(query), params).rowcount)  # type: ignore[attr-defined]


def _ledger(customer: str, kind: str, amount: int, order_id: str, balance: int) -> None:
    """Append the account's event (as estafeta's ledger does) and write its projection."""
    stream = f"account-{customer}"
    version = _one(
        "UPDATE payments.streams SET version = version + 1, last_tx_id = pg_current_xact_id(), updated_at = now()"
        " WHERE stream_id = :s RETURNING version",
        s=stream,
    )[0]
    _run(
        "INSERT INTO payments.events (stream_id, version, event_id, type, schema_version, data)"
        " VALUES (:s, :v, :e, :t, 1, CAST(:d AS jsonb))",
        s=stream, v=version, e=uuid.uuid4(), t=kind,
        d=json.dumps({"amount_cents": amount, "order_id": order_id}),
    )  # fmt: skip
    _run(
        "UPDATE payments.accounts SET balance_cents = :b, updated_at = now() WHERE customer_id = :c",
        b=balance, c=customer,
    )  # fmt: skip


@_datasource.transaction(name="charge_payment", isolation_level=ISOLATION)
def charge_payment(order: dict[str, Any]) -> bool:
    """Charge the order once; ``False`` (a refused row recorded) without an account or enough money."""
    found = _one("SELECT status FROM payments.payments WHERE order_id = :o", o=order["order_id"])
    if found is not None:
        return bool(found[0] == "charged")
    account = _one(
        "SELECT balance_cents FROM payments.accounts WHERE customer_id = :c FOR UPDATE", c=order["customer_id"]
    )
    if account is None or account[0] < order["amount_cents"]:
        _run(
            "INSERT INTO payments.payments (payment_id, order_id, customer_id, amount_cents, status, reason)"
            " VALUES (:p, :o, :c, 0, 'refused', 'not enough money')",
            p=uuid.uuid4(), o=order["order_id"], c=order["customer_id"],
        )  # fmt: skip
        return False
    balance = int(account[0]) - order["amount_cents"]
    _ledger(order["customer_id"], "MoneyWithdrawn", order["amount_cents"], order["order_id"], balance)
    _run(
        "INSERT INTO payments.payments (payment_id, order_id, customer_id, amount_cents, status)"
        " VALUES (:p, :o, :c, :a, 'charged')",
        p=uuid.uuid4(), o=order["order_id"], c=order["customer_id"], a=order["amount_cents"],
    )  # fmt: skip
    return True


@_datasource.transaction(name="refund_payment", isolation_level=ISOLATION)
def refund_payment(order: dict[str, Any]) -> int:
    """Give the order's charge back to the account, once; the cents refunded."""
    found = _one(
        "SELECT status, amount_cents FROM payments.payments WHERE order_id = :o FOR UPDATE", o=order["order_id"]
    )
    if found is None or found[0] != "charged":
        return 0
    account = _one(
        "SELECT balance_cents FROM payments.accounts WHERE customer_id = :c FOR UPDATE", c=order["customer_id"]
    )
    _ledger(order["customer_id"], "MoneyRefunded", int(found[1]), order["order_id"], int(account[0]) + int(found[1]))
    _run(
        "UPDATE payments.payments SET status = 'refunded', updated_at = now() WHERE order_id = :o", o=order["order_id"]
    )
    return int(found[1])


@_datasource.transaction(name="reserve_stock", isolation_level=ISOLATION)
def reserve_stock(order: dict[str, Any]) -> bool:
    """Reserve the stock once; ``False`` (a refused row recorded) for too little stock."""
    found = _one("SELECT status FROM inventory.reservations WHERE order_id = :o", o=order["order_id"])
    if found is not None:
        return bool(found[0] == "reserved")
    taken = _run(
        "UPDATE inventory.stock SET available = available - :q, updated_at = now() WHERE sku = :s AND available >= :q",
        q=order["quantity"], s=order["sku"],
    )  # fmt: skip
    status, quantity = ("reserved", order["quantity"]) if taken else ("refused", 0)
    _run(
        "INSERT INTO inventory.reservations (order_id, sku, quantity, status) VALUES (:o, :s, :q, :st)",
        o=order["order_id"], s=order["sku"], q=quantity, st=status,
    )  # fmt: skip
    return bool(taken)


@_datasource.transaction(name="set_order_status", isolation_level=ISOLATION)
def set_order_status(order: dict[str, Any], status: str) -> bool:
    """pending -> ``status`` (confirmed, or cancelled as the compensation of placing it)."""
    return bool(
        _run(
            "UPDATE orders.orders SET status = :st, updated_at = now() WHERE order_id = :o AND status = 'pending'",
            st=status,
            o=order["order_id"],
        )
    )


@_datasource.transaction(name="notify_customer", isolation_level=ISOLATION)
def notify_customer(order: dict[str, Any], kind: str) -> bool:
    """Record the notification once per kind (the primary key makes a second one a no-op)."""
    return bool(
        _run(
            "INSERT INTO notifications.sent (order_id, kind, customer_id) VALUES (:o, :k, :c) ON CONFLICT DO NOTHING",
            o=order["order_id"],
            k=kind,
            c=order["customer_id"],
        )
    )


@DBOS.workflow(name=WORKFLOW)
def order_saga(order: dict[str, Any]) -> str:
    """Charge, reserve, confirm, notify; a refusal compensates in reverse and notifies the cancellation."""
    if not charge_payment(order):
        return _compensate(order)
    if not reserve_stock(order):
        refund_payment(order)
        return _compensate(order)
    set_order_status(order, "confirmed")
    notify_customer(order, "confirmed")
    return "completed"


def _compensate(order: dict[str, Any]) -> str:
    set_order_status(order, "cancelled")
    notify_customer(order, "cancelled")
    return "compensated"


def main() -> None:
    """One DBOS executor: launch, listen to the queue, say ``ready``, run until terminated."""
    concurrency = int(os.environ["BENCH_DBOS_CONCURRENCY"])
    config: DBOSConfig = {
        "name": "estafeta_bench_orders",
        "system_database_url": os.environ["BENCH_DBOS_SYSTEM_URL"],
        "application_version": APP_VERSION,
        "executor_id": f"bench-{os.getpid()}",
        "log_level": "WARNING",
        "run_migrations": False,
    }
    DBOS(config=config)
    DBOS.launch()
    DBOS.register_queue(QUEUE, worker_concurrency=concurrency, polling_interval_sec=POLL_SECONDS)
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
