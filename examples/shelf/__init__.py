"""The shelf app: a service whose business table is a SQLAlchemy ORM model (the ``sqlalchemy`` extra).

Web handlers write ``Item`` rows and send estafeta messages in one ORM transaction
(``estafeta.sqlalchemy``, or ``estafeta.sqlalchemy.asyncio`` for ``AsyncSession``); its
steps use the ORM on their own transaction (``estafeta.sqlalchemy.session(ctx)``).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import attrs
from sqlalchemy import select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from estafeta import NOTHING_TO_UNDO, App, EventRegistry, Idempotency, Saga, SagaStep, Service, StepContext
from estafeta import sqlalchemy as es

shelf = Service("shelf", migrations=Path(__file__).parent / "migrations" / "shelf")
registry = EventRegistry()
store = shelf.use_events(registry)
idempotency = Idempotency(shelf)
app = App("shelf", services=[shelf])


class Base(DeclarativeBase):
    pass


class Item(Base):
    """A row of ``shelf.items``."""

    __tablename__ = "items"
    __table_args__ = {"schema": "shelf"}

    item_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(unique=True)
    quantity: Mapped[int] = mapped_column(default=0)


@attrs.frozen
class Restock:
    """Add ``quantity`` to the item (handled by a step that uses the ORM)."""

    item_id: uuid.UUID
    quantity: int


@registry.event("ItemAdded")
@attrs.frozen
class ItemAdded:
    """An item was put on the shelf (published, and appended to the item's stream)."""

    item_id: uuid.UUID
    name: str


@attrs.frozen
class Stocking:
    """The stocking saga's data."""

    item_id: uuid.UUID
    quantity: int


@shelf.step(Restock)
def restock(ctx: StepContext, command: Restock) -> None:
    """Add to the item's quantity through the ORM, in the step's transaction."""
    session = es.session(ctx)
    item = session.get(Item, command.item_id)
    if item is None:
        raise LookupError(f"no item {command.item_id}")
    item.quantity += command.quantity


@shelf.step(ItemAdded, name="count_item")
def count_item(ctx: StepContext, event: ItemAdded) -> None:
    """Subscribe to :class:`ItemAdded` (so that publishing it reaches someone)."""
    session = es.session(ctx)
    session.execute(select(Item.item_id).where(Item.item_id == event.item_id))


stocking = Saga(
    "stocking",
    service=shelf,
    data=Stocking,
    key="item_id",
    steps=[
        SagaStep("restock", action=lambda s: Restock(s.data.item_id, s.data.quantity), compensation=NOTHING_TO_UNDO)
    ],
)
