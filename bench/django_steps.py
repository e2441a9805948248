"""Two steps that make the same change to ``shelf.items``, for ``python -m bench.step_cost --django``.

- ``shelf.bench_by_sql``: ``UPDATE ... SET quantity = quantity + n`` on ``ctx.conn``;
- ``shelf.bench_by_django``: the same ``UPDATE`` through Django's ORM
  (``Item.objects.filter(...).update(quantity=F("quantity") + n)``).

The benchmark runs the first on estafeta's pool and on Django's connection
(``estafeta.django.step_connections``), and the second on Django's connection: what taking
Django's connection adds, then what the ORM adds on it.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import attrs

from estafeta import App, Service, StepContext

# The shelf's schema (examples/shelf's migrations), with steps of the benchmark's own.
shelf = Service("shelf", migrations=Path(__file__).parents[1] / "examples" / "shelf" / "migrations" / "shelf")
app = App("shelf_bench", services=[shelf])


@attrs.frozen
class BySql:
    item_id: uuid.UUID
    n: int


@attrs.frozen
class ByDjango:
    item_id: uuid.UUID
    n: int


@shelf.step(BySql, name="bench_by_sql")
def by_sql(ctx: StepContext, command: BySql) -> None:
    ctx.conn.execute("UPDATE shelf.items SET quantity = quantity + %s WHERE item_id = %s", (command.n, command.item_id))


@shelf.step(ByDjango, name="bench_by_django")
def by_django(ctx: StepContext, command: ByDjango) -> None:
    from django.db.models import F

    from examples.shelf_django.models import Item

    Item.objects.filter(item_id=command.item_id).update(quantity=F("quantity") + command.n)
