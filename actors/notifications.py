"""The Notifications service: tells a customer about an order, once per kind of news."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import attrs

from estafeta import Service, StepContext

from .migrations import MIGRATIONS

SERVICE = Service("notifications", migrations=MIGRATIONS / "notifications")

logger = logging.getLogger(__name__)


@attrs.frozen
class NotifyCustomer:
    """Tell the customer their order was ``confirmed`` or ``cancelled``."""

    order_id: uuid.UUID
    customer_id: str
    kind: str


@SERVICE.step(NotifyCustomer, lock=lambda command: str(command.order_id))
def notify_customer(ctx: StepContext, command: NotifyCustomer) -> dict[str, Any]:
    """Record the notification (the primary key makes a second one of a kind a no-op) and send it."""
    sent = ctx.conn.execute(
        """INSERT INTO notifications.sent (order_id, kind, customer_id, saga_id) VALUES (%s, %s, %s, %s)
           ON CONFLICT DO NOTHING""",
        (command.order_id, command.kind, command.customer_id, ctx.saga_id),
    ).rowcount
    if sent:
        # The message a real system would hand to its mail or push gateway.
        logger.info("to %s: your order %s is %s", command.customer_id, command.order_id, command.kind)
    return {"sent": bool(sent)}
