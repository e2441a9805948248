"""The order system as an estafeta app: its five services and the order saga."""

from __future__ import annotations

from estafeta import App

from . import inventory, notifications, order_saga, orders, payments, pingpong

#: The order system: orders (with the order saga's orchestrator), payments, inventory,
#: notifications, and the ping service operators use to check the wiring.
app = App(
    "shop",
    services=[orders.SERVICE, payments.SERVICE, inventory.SERVICE, notifications.SERVICE, pingpong.SERVICE],
)

#: The order saga (declared in :mod:`estafeta_actors.order_saga`, orchestrated by the orders service).
ORDER_SAGA = order_saga.ORDER_SAGA
