"""Event types of the event store tests, after seed 003: ``OrderCreated`` v1 had no currency, v2 has one."""

from __future__ import annotations

from typing import Any

import attrs

from estafeta.events.aggregates import Aggregate, applies
from estafeta.events.event_types import EventRegistry

registry = EventRegistry()

#: The currency an ``OrderCreated`` v1 (written before currencies existed) is read with.
DEFAULT_CURRENCY = "EUR"


@registry.event("OrderCreated", version=2)
@attrs.frozen
class OrderCreated:
    """v2: the amount has a currency. v1 was ``{order_id, customer_id, amount_cents}``."""

    order_id: str
    customer_id: str
    amount_cents: int
    currency: str


@registry.upcaster("OrderCreated", from_version=1)
def order_created_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v1 events were all in the shop's only currency of the time."""
    return {**data, "currency": DEFAULT_CURRENCY}


@registry.event("PaymentReceived")
@attrs.frozen
class PaymentReceived:
    order_id: str
    amount_cents: int


@registry.event("OrderConfirmed")
@attrs.frozen
class OrderConfirmed:
    order_id: str


@registry.event("ItemAdded")
@attrs.frozen
class ItemAdded:
    """A line of a long-running stream (snapshot and load-time tests)."""

    sku: str
    quantity: int


@attrs.define
class Order(Aggregate):
    """Seed 003's order: created, paid, confirmed."""

    snapshot_every = 10

    order_id: str = ""
    status: str = "new"
    amount_cents: int = 0
    currency: str = ""
    paid_cents: int = 0
    items: int = 0

    @classmethod
    def create(cls, order_id: str, customer_id: str, amount_cents: int, currency: str) -> Order:
        order = cls.new(f"order-{order_id}")
        order.record(OrderCreated(order_id, customer_id, amount_cents, currency))
        return order

    def pay(self, amount_cents: int) -> None:
        if self.status != "created":
            raise ValueError(f"cannot pay a {self.status} order")
        self.record(PaymentReceived(self.order_id, amount_cents))

    def confirm(self) -> None:
        if self.paid_cents < self.amount_cents:
            raise ValueError("can only confirm a paid order")
        self.record(OrderConfirmed(self.order_id))

    def add_item(self, sku: str, quantity: int) -> None:
        self.record(ItemAdded(sku, quantity))

    @applies(OrderCreated)
    def _created(self, event: OrderCreated) -> None:
        self.order_id = event.order_id
        self.status = "created"
        self.amount_cents = event.amount_cents
        self.currency = event.currency

    @applies(PaymentReceived)
    def _paid(self, event: PaymentReceived) -> None:
        self.paid_cents += event.amount_cents

    @applies(OrderConfirmed)
    def _confirmed(self, event: OrderConfirmed) -> None:
        self.status = "confirmed"

    @applies(ItemAdded)
    def _item(self, event: ItemAdded) -> None:
        self.items += event.quantity
