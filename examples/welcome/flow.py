"""The welcome app: three services, their steps, and the events that chain them.

``dramatiq examples.welcome`` serves them, and only them.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import attrs
import psycopg

from estafeta import App, Service, StepContext

_MIGRATIONS = Path(__file__).parent / "migrations"
customers = Service("customers", migrations=_MIGRATIONS / "customers")
bonus = Service("bonus", migrations=_MIGRATIONS / "bonus")
mailer = Service("mailer", migrations=_MIGRATIONS / "mailer")

#: The welcome flow: choreography between three services, no orchestrator.
app = App("welcome", services=[customers, bonus, mailer])

#: Points of the welcome bonus.
WELCOME_POINTS = 100


@attrs.frozen
class CustomerRegistered:
    """A new customer (published by the customers service)."""

    customer_id: uuid.UUID
    email: str


@attrs.frozen
class BonusActivated:
    """The customer's welcome bonus is active (published by the bonus service)."""

    customer_id: uuid.UUID
    email: str
    points: int


def register_customer(conn: psycopg.Connection[Any], email: str) -> tuple[uuid.UUID, uuid.UUID]:
    """Register a customer and publish :class:`CustomerRegistered`, in the caller's transaction.

    Returns the customer id and the saga id that every message of the flow will carry.
    """
    customer_id, saga_id = uuid.uuid4(), uuid.uuid4()
    conn.execute("INSERT INTO customers.customers (customer_id, email) VALUES (%s, %s)", (customer_id, email))
    customers.publish(conn, CustomerRegistered(customer_id, email), saga_id=saga_id)
    return customer_id, saga_id


@bonus.step(CustomerRegistered, name="activate_welcome_bonus")
def activate_welcome_bonus(ctx: StepContext, event: CustomerRegistered) -> None:
    """Give the new customer their welcome bonus, once, and announce it."""
    activated = ctx.conn.execute(
        """INSERT INTO bonus.bonuses (customer_id, level, points, saga_id) VALUES (%s, 'welcome', %s, %s)
           ON CONFLICT DO NOTHING""",
        (event.customer_id, WELCOME_POINTS, ctx.saga_id),
    ).rowcount
    if activated:
        ctx.publish(BonusActivated(event.customer_id, event.email, WELCOME_POINTS))


@mailer.step(BonusActivated, name="send_welcome")
def send_welcome(ctx: StepContext, event: BonusActivated) -> None:
    """Send the welcome mail, once (the primary key absorbs a second one)."""
    ctx.conn.execute(
        "INSERT INTO mailer.sent (customer_id, kind, saga_id) VALUES (%s, 'welcome', %s) ON CONFLICT DO NOTHING",
        (event.customer_id, ctx.saga_id),
    )


@customers.step(BonusActivated, name="record_bonus")
def record_bonus(ctx: StepContext, event: BonusActivated) -> None:
    """Note the bonus on the customer: a second subscriber of the same event."""
    ctx.conn.execute(
        "UPDATE customers.customers SET bonus_points = %s WHERE customer_id = %s", (event.points, event.customer_id)
    )


def journeys(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """Each customer's way through the flow: registered, bonus (with its saga id), mail, recorded."""
    rows = conn.execute(
        """SELECT c.customer_id, c.email, b.saga_id, b.points, m.saga_id, c.bonus_points
           FROM customers.customers c
           LEFT JOIN bonus.bonuses b USING (customer_id)
           LEFT JOIN mailer.sent m ON m.customer_id = c.customer_id AND m.kind = 'welcome'
           ORDER BY c.email"""
    ).fetchall()
    keys = ("customer_id", "email", "bonus_saga_id", "bonus_points", "mail_saga_id", "recorded_points")
    return [dict(zip(keys, (str(v) if isinstance(v, uuid.UUID) else v for v in row), strict=True)) for row in rows]
