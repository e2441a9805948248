"""``estafeta seed``: accounts and stock for the order system; and the demo's mix of orders."""

from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING

import attrs
import click

from .context import order_system

if TYPE_CHECKING:
    from estafeta import Runtime


@attrs.frozen
class OrderPlan:
    """Accounts, stock and orders chosen so that some orders fail for lack of money or stock."""

    #: Opening balance of each customer, in cents.
    balances: dict[str, int]
    #: Units in stock of each SKU.
    stock: dict[str, int]
    #: (customer, sku, quantity, amount in cents) of each order, in the order they are placed.
    orders: list[tuple[str, str, int, int]]


def plan_orders(count: int, *, prefix: str = "", rng: random.Random | None = None) -> OrderPlan:
    """``count`` orders over about ten orders per customer and forty per SKU.

    Each customer can pay for about 85% of what they order and each SKU covers about
    two thirds of its demand, so the last orders of a busy customer or SKU are refused
    and their sagas compensate.
    """
    rng = rng or random.Random()
    customers = [f"{prefix}c{i}" for i in range(1, max(2, count // 10) + 1)]
    skus = [f"{prefix}sku{i}" for i in range(1, max(2, count // 40) + 1)]
    orders = [
        (rng.choice(customers), rng.choice(skus), rng.randint(1, 3), rng.randrange(500, 5_001, 50))
        for _ in range(count)
    ]
    balances = {c: sum(o[3] for o in orders if o[0] == c) * 85 // 100 for c in customers}
    stock = {s: sum(o[2] for o in orders if o[1] == s) * 2 // 3 for s in skus}
    return OrderPlan(balances, stock, orders)


def seed_services(runtime: Runtime, balances: dict[str, int], stock: dict[str, int]) -> tuple[int, int]:
    """Open the accounts and stock the SKUs that do not exist yet; return how many of each were created."""
    from estafeta_actors import inventory, payments

    with runtime.database("payments").transaction() as conn:
        accounts = payments.open_accounts(conn, balances)
    with runtime.database("inventory").transaction() as conn:
        skus = inventory.add_stock(conn, stock)
    return accounts, skus


@click.command("seed")
@click.option("--customers", type=click.IntRange(min=0), default=10, show_default=True, help="Accounts to open.")
@click.option(
    "--balance", type=click.IntRange(min=0), default=100_000, show_default=True, help="Opening balance, in cents."
)
@click.option("--skus", type=click.IntRange(min=0), default=5, show_default=True, help="SKUs to stock.")
@click.option("--stock", type=click.IntRange(min=0), default=100, show_default=True, help="Units of each SKU.")
@click.option("--prefix", default="", help="Prefix of the names: customers are <prefix>c1.., SKUs <prefix>sku1..")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def seed_command(customers: int, balance: int, skus: int, stock: int, prefix: str, as_json: bool) -> None:
    """Open customer accounts and stock SKUs for the order system (existing ones are left as they are).

    Customers are named c1, c2, ... and SKUs sku1, sku2, ... (after --prefix).
    """
    context = order_system()
    from estafeta_actors import inventory, payments

    runtime = context.runtime
    balances = {f"{prefix}c{i}": balance for i in range(1, customers + 1)}
    levels = {f"{prefix}sku{i}": stock for i in range(1, skus + 1)}
    runtime.migrate([payments.SERVICE, inventory.SERVICE])
    accounts, created = seed_services(runtime, balances, levels)
    if as_json:
        click.echo(json.dumps({"accounts_created": accounts, "skus_created": created}))
        return
    click.echo(f"accounts: {accounts} created, {customers - accounts} already there")
    click.echo(f"skus: {created} created, {skus - created} already there")


COMMANDS = [seed_command]
