"""The shelf's ``Restock`` handled by a Django project: the step writes through Django's ORM.

Its service is the shelf's schema (``examples/shelf``'s migrations), seen from this project;
run it with ``dramatiq examples.shelf_django.worker``, whose steps take Django's connection
(``estafeta.django.step_connections``): the ``Item`` update, the inbox record and the step's
outbox rows are one transaction.
"""

from __future__ import annotations

from pathlib import Path

from django.db.models import F

from estafeta import App, Service, StepContext
from examples.shelf import Restock

from .models import Item

shelf = Service("shelf", migrations=Path(__file__).parents[1] / "shelf" / "migrations" / "shelf")
app = App("shelf_django", services=[shelf])


@shelf.step(Restock)
def restock(ctx: StepContext, command: Restock) -> None:
    """Add to the item's quantity through Django's ORM, in the step's transaction."""
    if not Item.objects.filter(item_id=command.item_id).update(quantity=F("quantity") + command.quantity):
        raise LookupError(f"no item {command.item_id}")
