"""The order saga: place an order, charge it, reserve its stock, confirm it, tell the customer.

Placing an order writes the order row, the saga row and the first command in one
transaction (:func:`place_order`). A business failure (no money, no stock) compensates
what was done, in reverse order: release the stock, refund the payment, cancel the
order, then tell the customer of the cancellation. Confirming the order is the point of
no return: from there on the steps are retried, never compensated.
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import psycopg

from estafeta import EstafetaError, Runtime, Saga, SagaState, SagaStep

from . import ledger, order_history, orders, payments
from .inventory import ReleaseStock, ReserveStock
from .notifications import NotifyCustomer
from .orders import CancelOrder, ConfirmOrder
from .payments import ChargePayment, RefundPayment

#: Order ids derived from idempotency keys live in this namespace.
_IDEMPOTENCY_NAMESPACE = uuid.UUID("6f0b1a2e-5d7c-4f43-9a55-2b8e3c1d0e77")


@attrs.frozen
class OrderData:
    """What the order saga carries from step to step (its row's ``payload``)."""

    order_id: uuid.UUID
    customer_id: str
    sku: str
    quantity: int
    amount_cents: int


def _data(state: SagaState) -> OrderData:
    data = state.data
    assert isinstance(data, OrderData)
    return data


def _notify(kind: str) -> Any:
    def build(state: SagaState) -> NotifyCustomer:
        return NotifyCustomer(_data(state).order_id, _data(state).customer_id, kind)

    return build


#: The order saga, orchestrated by ``orders.saga_order_reply`` with its state in ``orders.saga_order``.
ORDER_SAGA = Saga(
    "order",
    service=orders.SERVICE,
    data=OrderData,
    key="order_id",
    steps=[
        SagaStep("place_order", compensation=lambda s: CancelOrder(_data(s).order_id)),
        SagaStep(
            "charge_payment",
            action=lambda s: ChargePayment(_data(s).order_id, _data(s).customer_id, _data(s).amount_cents),
            compensation=lambda s: RefundPayment(_data(s).order_id, _data(s).customer_id),
        ),
        SagaStep(
            "reserve_inventory",
            action=lambda s: ReserveStock(_data(s).order_id, _data(s).sku, _data(s).quantity),
            compensation=lambda s: ReleaseStock(_data(s).order_id, _data(s).sku),
        ),
        SagaStep("confirm_order", action=lambda s: ConfirmOrder(_data(s).order_id), retriable=True),
        SagaStep("notify_customer", action=_notify("confirmed"), retriable=True),
    ],
    after_compensation=[SagaStep("notify_cancellation", action=_notify("cancelled"))],
    # Each transition appends the order's history (actors/order_events.py) in its own transaction.
    on_transition=order_history.record_transition,
)


class IdempotencyConflict(EstafetaError):
    """The idempotency key was already used for a different order."""


@attrs.frozen
class PlacedOrder:
    """The outcome of :func:`place_order`."""

    order_id: uuid.UUID
    saga_id: uuid.UUID
    #: ``False``: the idempotency key had already placed this order; nothing new was written.
    placed: bool


def place_order(
    conn: psycopg.Connection[Any],
    *,
    customer_id: str,
    sku: str,
    quantity: int,
    amount_cents: int,
    idempotency_key: str | None = None,
    step_timeout: float = 30.0,
    traceparent: str | None = None,
) -> PlacedOrder:
    """Place an order in the caller's transaction: the order row, its saga row and the first command.

    The same ``idempotency_key`` twice places one order (the second call returns the
    first order); used for a different order it raises :class:`IdempotencyConflict`.
    A W3C ``traceparent`` (an HTTP request's) makes the saga's messages part of its trace.
    """
    if quantity <= 0 or amount_cents <= 0:
        raise ValueError("quantity and amount must be positive")
    order_id = uuid.uuid5(_IDEMPOTENCY_NAMESPACE, idempotency_key) if idempotency_key else uuid.uuid4()
    data = OrderData(order_id, customer_id, sku, quantity, amount_cents)
    inserted = orders.insert_order(
        conn,
        order_id,
        customer_id=customer_id,
        sku=sku,
        quantity=quantity,
        amount_cents=amount_cents,
        idempotency_key=idempotency_key,
    )
    if inserted:
        saga_id = ORDER_SAGA.start(conn, data, step_timeout=step_timeout, traceparent=traceparent)
        return PlacedOrder(order_id, saga_id, True)
    existing = orders.order_by_key(conn, idempotency_key) if idempotency_key else None
    if existing is None or attrs.astuple(data) != (
        existing.order_id,
        existing.customer_id,
        existing.sku,
        existing.quantity,
        existing.amount_cents,
    ):
        raise IdempotencyConflict(f"idempotency key {idempotency_key!r} was already used for a different order")
    (saga_id, *_) = ORDER_SAGA.of_key(conn, existing.order_id)
    return PlacedOrder(existing.order_id, saga_id, False)


@attrs.frozen
class Reconciliation:
    """Whether money and stock are conserved over a set of orders, accounts and SKUs."""

    #: Cents in the accounts at the start, and now in the accounts plus charged (unrefunded) payments.
    money_before: int
    money_now: int
    #: From the ledger's events alone: opening balances and deposits, and the replayed
    #: balances plus charged payments now; how many events were replayed.
    ledger_deposited: int
    ledger_now: int
    ledger_events: int
    #: Accounts whose ``payments.accounts`` row differs from the ledger's replay, with both.
    projection_mismatches: list[str]
    #: Units in stock at the start, and now in stock plus reserved (unreleased) reservations.
    stock_before: int
    stock_now: int
    #: Sagas by status.
    sagas: Mapping[str, int]
    #: Orders whose final state disagrees across services, with why.
    mismatches: list[str]

    @property
    def ok(self) -> bool:
        """Money conserved (in the accounts and in the ledger), stock conserved, every order consistent."""
        money = self.money_before == self.money_now == self.ledger_now == self.ledger_deposited
        return money and not self.projection_mismatches and self.stock_before == self.stock_now and not self.mismatches


def reconcile(
    runtime: Runtime, order_ids: Iterable[uuid.UUID], balances: Mapping[str, int], stock: Mapping[str, int]
) -> Reconciliation:
    """Check the outcome of ``order_ids``, placed against accounts seeded with ``balances`` and SKUs with ``stock``.

    Every completed order must be confirmed, charged its amount and have its stock
    reserved; every compensated one cancelled, with nothing charged or reserved. The
    accounts are also replayed from the ledger's events: their balances plus the charged
    payments must equal what was seeded, each must equal its ``payments.accounts`` row, and
    what the ledger charged each order must be what ``payments.payments`` says; and the
    history of each must hold each of its facts exactly once.
    """
    ids = list(order_ids)
    with runtime.database("orders").connection() as conn:
        placed = {r[0]: r[1:] for r in conn.execute(_ORDERS, (ids,)).fetchall()}
        outcome = dict(conn.execute(_SAGA_STATUS, (ids,)).fetchall())
        history = order_history.disagreements(conn, outcome)
    with runtime.database("payments").connection() as conn:
        money = conn.execute(_MONEY, {"c": list(balances)}).fetchone()
        charged = {r[0]: r[1] for r in conn.execute(_CHARGED, (ids,)).fetchall()}
        audit = ledger.audit(conn, payments.STORE, balances)
        projected = ledger.projected_balances(conn, balances)
    with runtime.database("inventory").connection() as conn:
        units = conn.execute(_UNITS, {"s": list(stock)}).fetchone()
        reserved = {r[0]: r[1] for r in conn.execute(_RESERVED, (ids,)).fetchall()}
    mismatches = _mismatches(ids, placed, outcome, charged, reserved) + history
    mismatches += [
        f"order {o}: the ledger charged {audit.charged.get(o)}, payments.payments says {charged.get(o)}"
        for o in ids
        if audit.charged.get(o) != charged.get(o)
    ]
    counts = collections.Counter(outcome.values())
    assert money is not None and units is not None
    return Reconciliation(
        money_before=sum(balances.values()),
        money_now=int(money[0]) + int(money[1]),
        ledger_deposited=audit.deposited,
        ledger_now=sum(audit.balances.values()) + int(money[1]),
        ledger_events=audit.events,
        projection_mismatches=[
            f"account {c}: the ledger replays to {audit.balances.get(c)}, payments.accounts has {projected.get(c)}"
            for c in balances
            if audit.balances.get(c) != projected.get(c)
        ],
        stock_before=sum(stock.values()),
        stock_now=int(units[0]),
        sagas=dict(counts),
        mismatches=mismatches,
    )


def _mismatches(
    ids: list[uuid.UUID],
    placed: Mapping[uuid.UUID, Any],
    outcome: Mapping[uuid.UUID, str],
    charged: Mapping[uuid.UUID, int],
    reserved: Mapping[uuid.UUID, int],
) -> list[str]:
    # Completed: confirmed, charged its amount, its quantity reserved. Compensated:
    # cancelled, nothing charged, nothing reserved. Anything else is a mismatch.
    found = []
    for order_id in ids:
        status, amount, quantity = placed.get(order_id, (None, None, None))
        saga = outcome.get(order_id, "missing")
        expected = {"completed": ("confirmed", amount, quantity), "compensated": ("cancelled", None, None)}.get(saga)
        actual = (status, charged.get(order_id), reserved.get(order_id))
        if expected != actual:
            found.append(f"order {order_id}: saga {saga}, found {actual}")
    return found


_ORDERS = "SELECT order_id, status, amount_cents, quantity FROM orders.orders WHERE order_id = ANY(%s)"
_SAGA_STATUS = "SELECT order_id, status FROM orders.saga_order WHERE order_id = ANY(%s)"
_MONEY = """SELECT coalesce((SELECT sum(balance_cents) FROM payments.accounts WHERE customer_id = ANY(%(c)s)), 0),
                  coalesce((SELECT sum(amount_cents) FROM payments.payments
                            WHERE customer_id = ANY(%(c)s) AND status = 'charged'), 0)"""
_CHARGED = "SELECT order_id, amount_cents FROM payments.payments WHERE order_id = ANY(%s) AND status = 'charged'"
_UNITS = """SELECT coalesce((SELECT sum(available) FROM inventory.stock WHERE sku = ANY(%(s)s)), 0)
                 + coalesce((SELECT sum(quantity) FROM inventory.reservations
                             WHERE sku = ANY(%(s)s) AND status = 'reserved'), 0)"""
_RESERVED = "SELECT order_id, quantity FROM inventory.reservations WHERE order_id = ANY(%s) AND status = 'reserved'"
