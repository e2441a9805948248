"""The order's history as events: what the order saga learns, appended to ``order-<order_id>`` in the orders store.

The orders service orchestrates the order saga, so every fact about an order reaches its
database: the order placed (by :func:`estafeta_actors.order_saga.place_order`), and each
participant's answer — the payment charged or refused, the stock reserved or refused,
the order confirmed or cancelled, the customer notified, the compensations done — as a
reply that comes through the participant's outbox and the orchestrator's inbox-protected
step. :func:`record_transition` is the saga's ``on_transition`` hook: it turns each
transition into events and appends them in the transition's own transaction, so each
fact is recorded exactly once (a duplicate or stale reply makes no transition) and no
service's table is ever read from another service's database.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import psycopg

from estafeta import EventMetadata, EventRegistry, SagaTransition

from . import orders

#: The order history's event types.
EVENTS = EventRegistry()


@EVENTS.event()
@attrs.frozen
class OrderPlaced:
    """The order was placed (its saga started)."""

    customer_id: str
    sku: str
    quantity: int
    amount_cents: int


@EVENTS.event()
@attrs.frozen
class PaymentCharged:
    """Payments charged the order's amount."""

    amount_cents: int


@EVENTS.event()
@attrs.frozen
class PaymentRefused:
    """Payments refused the charge (a business failure: no account, not enough money)."""

    reason: str


@EVENTS.event()
@attrs.frozen
class StockReserved:
    """Inventory reserved the order's stock."""

    sku: str
    quantity: int


@EVENTS.event()
@attrs.frozen
class StockRefused:
    """Inventory refused the reservation (unknown SKU, out of stock)."""

    reason: str


@EVENTS.event()
@attrs.frozen
class OrderConfirmed:
    """The order was confirmed: the point of no return."""


@EVENTS.event()
@attrs.frozen
class StepAbandoned:
    """The saga gave up on a step without a refusal: no answer by its deadlines, or an operator's abort."""

    step: str
    reason: str


@EVENTS.event()
@attrs.frozen
class PaymentRefunded:
    """Payments refunded the order (a compensation; ``0`` when nothing had been charged)."""

    amount_cents: int


@EVENTS.event()
@attrs.frozen
class StockReleased:
    """Inventory released the order's reservation (a compensation; ``0`` when nothing was reserved)."""

    quantity: int


@EVENTS.event()
@attrs.frozen
class OrderCancelled:
    """The order was cancelled, and why (the saga's reason for compensating)."""

    reason: str


@EVENTS.event()
@attrs.frozen
class CustomerNotified:
    """The customer was told the order was ``confirmed`` or ``cancelled``."""

    kind: str


@EVENTS.event()
@attrs.frozen
class SagaFailed:
    """The order's saga stopped for an operator (``estafeta sagas resume`` retries the step)."""

    step: str
    reason: str


@EVENTS.event()
@attrs.frozen
class SagaResumed:
    """An operator resumed the order's saga at ``step``."""

    step: str


#: Every event type of the order history.
EVENT_TYPES: tuple[type, ...] = (
    OrderPlaced,
    PaymentCharged,
    PaymentRefused,
    StockReserved,
    StockRefused,
    OrderConfirmed,
    StepAbandoned,
    PaymentRefunded,
    StockReleased,
    OrderCancelled,
    CustomerNotified,
    SagaFailed,
    SagaResumed,
)

#: The orders service's event store (its tables in the ``orders`` schema).
STORE = orders.SERVICE.use_events(EVENTS)


def stream_id(order_id: uuid.UUID | str) -> str:
    """The stream of an order's history."""
    return f"order-{order_id}"


def _number(result: Mapping[str, Any], key: str, default: int) -> int:
    value = result.get(key)
    return int(value) if isinstance(value, int) else default


# What a step's successful answer means, by (the saga's status when it was asked, step).
_DONE: dict[tuple[str, str], Callable[[Any, Mapping[str, Any], str], Any]] = {
    ("running", "charge_payment"): lambda d, r, _: PaymentCharged(d.amount_cents),
    ("running", "reserve_inventory"): lambda d, r, _: StockReserved(d.sku, d.quantity),
    ("running", "confirm_order"): lambda d, r, _: OrderConfirmed(),
    ("running", "notify_customer"): lambda d, r, _: CustomerNotified("confirmed"),
    ("compensating", "charge_payment"): lambda d, r, _: PaymentRefunded(_number(r, "refunded_cents", 0)),
    ("compensating", "reserve_inventory"): lambda d, r, _: StockReleased(_number(r, "released", 0)),
    ("compensating", "place_order"): lambda d, r, why: OrderCancelled(why),
    ("compensating", "notify_cancellation"): lambda d, r, _: CustomerNotified("cancelled"),
}
# What a refusal means, by the step refused.
_REFUSED: dict[str, Callable[[str], Any]] = {"charge_payment": PaymentRefused, "reserve_inventory": StockRefused}


def events_for(transition: SagaTransition) -> list[Any]:
    """The order-history events a transition of the order saga records (often none: a re-send, say)."""
    data, reply, before = transition.data, transition.reply, transition.previous_status
    found: list[Any] = []
    if transition.event == "started":
        found.append(OrderPlaced(data.customer_id, data.sku, data.quantity, data.amount_cents))
    elif transition.event == "resumed":
        found.append(SagaResumed(transition.step))
    elif reply is not None and reply.ok and before is not None and transition.previous_step is not None:
        if before == "gave_up":  # a late answer to the command the saga gave up on: asked while it ran or compensated
            before = "compensating" if reply.context.get("direction") == "compensation" else "running"
        done = _DONE.get((before, transition.previous_step))
        if done is not None and data is not None:
            found.append(done(data, reply.result or {}, transition.error or ""))
    elif reply is not None and not reply.ok and before == "running" and transition.previous_step in _REFUSED:
        found.append(_REFUSED[transition.previous_step](reply.error or ""))
    elif reply is None and transition.event in ("compensating", "compensated") and transition.previous_step:
        found.append(StepAbandoned(transition.previous_step, transition.error or ""))
    if transition.event in ("failed", "gave_up"):  # stopped for an operator (a given-up one may still move on)
        found.append(SagaFailed(transition.step, transition.error or ""))
    return found


def record_transition(conn: psycopg.Connection[Any], transition: SagaTransition) -> None:
    """The order saga's ``on_transition`` hook: append the transition's events to the order's stream.

    It runs in the transaction of the transition (the orchestrator's step for a reply,
    :func:`~estafeta_actors.order_saga.place_order` for the start, the watchdog or an operator's
    command otherwise), so the events commit with the saga's move or not at all.
    """
    found = events_for(transition)
    if found:
        metadata = EventMetadata(correlation_id=str(transition.saga_id))
        STORE.append(conn, stream_id(transition.key), found, metadata=metadata)
