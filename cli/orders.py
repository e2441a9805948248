"""``estafeta orders``: place orders through the outbox, and see how they went."""

from __future__ import annotations

import itertools
import json
import time
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn

import attrs
import click

from estafeta.observability import tracing as tracing

from .context import order_system
from .projections import Moment
from .tables import echo_table, when

if TYPE_CHECKING:
    import psycopg

    from estafeta import Runtime
    from estafeta_actors.order_history import OrderView, Projected
    from estafeta_actors.order_saga import PlacedOrder

#: Orders placed per transaction by ``--count`` (each order's rows still commit together).
BATCH = 100

_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def _ready() -> Runtime:
    context = order_system()
    from estafeta_actors import orders

    runtime = context.runtime
    pending = runtime.migrate([orders.SERVICE], check=True)["orders"]
    if pending:
        raise click.ClickException("the orders schema is not migrated: run `estafeta migrate` first")
    return runtime


@click.group("orders")
def orders_group() -> None:
    """Place orders and see how their sagas went."""


@orders_group.command("place")
@click.option("--customer", "customers", multiple=True, required=True, help="Customer id (repeatable: used in turn).")
@click.option("--sku", "skus", multiple=True, required=True, help="SKU (repeatable: used in turn).")
@click.option(
    "--quantity", type=click.IntRange(min=1), default=1, show_default=True, help="Units of the SKU per order."
)
@click.option("--amount", type=click.IntRange(min=1), required=True, help="Amount to charge, in cents.")
@click.option("--count", type=click.IntRange(1, 1_000_000), default=1, show_default=True, help="Orders to place.")
@click.option("--idempotency-key", "key", help="Placing twice with the same key places once (--count: KEY-1..KEY-N).")
@click.option("-v", "--verbose", is_flag=True, help="Also print one line per order: its id, its saga's id.")
@_json_option
def place_command(
    customers: tuple[str, ...],
    skus: tuple[str, ...],
    quantity: int,
    amount: int,
    count: int,
    key: str | None,
    verbose: bool,
    as_json: bool,
) -> None:
    """Enqueue orders: each order's row, its saga and its first command commit in one transaction.

    Prints one line: how many orders were placed (and how many a reused key had placed
    already), in how long, and the first and last order (the only one's saga too); -v adds
    a line per order before it; --json prints every order (order_id, saga_id, placed).
    The sagas run wherever `dramatiq estafeta_actors` and `estafeta relay` run for this database
    and broker (with the default stub:// broker nothing outside this process would run
    them: try `estafeta demo`).
    """
    runtime = _ready()
    from estafeta_actors.order_saga import IdempotencyConflict

    keys = [None] * count if key is None else ([key] if count == 1 else [f"{key}-{i}" for i in range(1, count + 1)])
    who = list(zip(itertools.cycle(customers), itertools.cycle(skus), keys, strict=False))
    started = time.monotonic()
    try:
        placed = _place(runtime, who, quantity, amount)
    except IdempotencyConflict as exc:
        raise click.BadParameter(str(exc), param_hint="--idempotency-key") from None
    seconds = time.monotonic() - started
    if as_json:
        click.echo(json.dumps([_jsonable(attrs.asdict(p)) for p in placed]))
        return
    if verbose:
        for p in placed:
            click.echo(f"order {p.order_id} saga {p.saga_id} {'placed' if p.placed else 'already placed (same key)'}")
    click.echo(placed_summary(placed, seconds))


def placed_summary(placed: list[PlacedOrder], seconds: float) -> str:
    """One line for ``placed``: how many were placed (and found placed by their key), in how long, which ones."""
    new = sum(p.placed for p in placed)
    again = f", {len(placed) - new} already placed (same key)," if new < len(placed) else ""
    rate = f" ({new / seconds:,.0f} orders/s)" if new > 1 and seconds > 0 else ""
    head = f"placed {new:,} order{'' if new == 1 else 's'}{again} in {seconds:.2f} s{rate}"
    if len(placed) == 1:
        return f"{head}: order {placed[0].order_id}, saga {placed[0].saga_id}"
    return f"{head}: first order {placed[0].order_id}, last order {placed[-1].order_id}"


def _place(runtime: Runtime, who: list[tuple[str, str, str | None]], quantity: int, amount: int) -> list[PlacedOrder]:
    from estafeta_actors.order_saga import place_order

    placed = []
    for batch in (who[i : i + BATCH] for i in range(0, len(who), BATCH)):
        with runtime.database("orders").transaction() as conn:
            for customer, sku, key in batch:
                # Each order starts a trace of its own: its saga's messages are all in it.
                with tracing.span("orders place") as span:
                    order = place_order(
                        conn,
                        customer_id=customer,
                        sku=sku,
                        quantity=quantity,
                        amount_cents=amount,
                        idempotency_key=key,
                        step_timeout=runtime.settings.saga_step_timeout,
                    )
                    if span is not None:
                        span.set_attributes(
                            {"estafeta.order.id": str(order.order_id), "estafeta.saga.id": str(order.saga_id)}
                        )
                placed.append(order)
    return placed


@orders_group.command("status")
@click.argument("order_id", type=click.UUID, required=False)
@_json_option
def status_command(order_id: uuid.UUID | None, as_json: bool) -> None:
    """One order, its saga and its history (ORDER_ID), or how many orders and sagas are in each status.

    The history comes from the order_summary projection, which may lag the events (the
    output says by how much); `estafeta orders history ORDER_ID` reads the events themselves.
    """
    runtime = _ready()
    from estafeta_actors import order_history, orders
    from estafeta_actors.order_saga import ORDER_SAGA
    from estafeta_sql import saga_reports, sagas

    with runtime.database("orders").connection() as conn:
        if order_id is None:
            counts = {
                "orders": orders.count_by_status(conn),
                "sagas": saga_reports.count_by_status(conn, ORDER_SAGA.table),
            }
            _print_counts(counts, as_json)
            return
        order = orders.get_order(conn, order_id)
        if order is None:
            raise click.BadParameter(f"no order {order_id}", param_hint="ORDER_ID")
        rows = [sagas.get(conn, ORDER_SAGA.table, s) for s in sagas.of_key(conn, ORDER_SAGA.table, order_id)]
        projected = order_history.projected(conn, order_id)
    found = {**_jsonable(attrs.asdict(order)), "sagas": [_jsonable(attrs.asdict(r)) for r in rows if r]}
    if as_json:
        history = _jsonable(attrs.asdict(projected.view)) if projected.view else None
        lag = {"events": projected.lag_events, "seconds": projected.lag_seconds}
        click.echo(json.dumps({**found, "history": history, "projection_lag": lag}))
        return
    click.echo(
        f"order {order.order_id}: {order.status} ({order.customer_id}, {order.quantity} x {order.sku},"
        f" {order.amount_cents} cents)"
    )
    for r in rows:
        if r is not None:
            error = f" - {r.last_error}" if r.last_error else ""
            click.echo(f"saga {r.saga_id}: {r.status} at {r.current_step}{error}")
    _print_projected(projected)


def _print_projected(projected: Projected) -> None:
    if not projected.built:
        click.echo(
            "history: the order_summary projection has not run yet (the workers run it, or `estafeta projections run`)"
        )
        return
    if projected.view is None and not projected.lag_events:
        click.echo("history: none recorded (the order was placed before the orders service recorded events)")
        return
    behind = ""
    if projected.lag_events:
        age = f", the oldest {projected.lag_seconds:.3f} s old" if projected.lag_seconds is not None else ""
        behind = f", {projected.lag_events} event(s) behind{age}; `orders history` reads the events themselves"
    click.echo(f"history (order_summary projection{behind}):")
    if projected.view is not None:
        _print_timeline(projected.view)


def _print_timeline(view: OrderView) -> None:
    rows = [(when(entry.at, precise=True), entry.what, entry.detail) for entry in view.timeline]
    echo_table(("AT", "WHAT", "DETAIL"), rows, empty="  no facts recorded", indent="  ")


@orders_group.command("history")
@click.argument("order_id", type=click.UUID)
@click.option(
    "--as-of", "as_of", type=Moment(), help="The order as it was at this time (ISO 8601; UTC without offset)."
)
@_json_option
def history_command(order_id: uuid.UUID, as_of: datetime | None, as_json: bool) -> None:
    """An order's history from its events: its state and timeline now, or as it was at a time (--as-of).

    It reads the orders service's event store (not the projection), so it is exact, and
    works for any time, also before the order_summary projection existed.
    """
    runtime = _ready()
    from estafeta_actors import order_history

    with runtime.database("orders").connection() as conn:
        view = order_history.as_of(conn, order_id, as_of)
        if view is None:
            _no_history(conn, order_id, as_of)
    if as_json:
        click.echo(json.dumps({"as_of": as_of.isoformat() if as_of else None, **_jsonable(attrs.asdict(view))}))
        return
    asked = f" as of {as_of.isoformat()}" if as_of else ""
    what = f"{view.customer_id}, {view.quantity} x {view.sku}, {view.amount_cents} cents"
    if view.placed_at is None:
        what = "placed before its history was recorded"
    reason = f": {view.cancel_reason}" if view.cancel_reason else ""
    click.echo(f"order {view.order_id}{asked}: {view.status}{reason} ({what})")
    if view.failure:
        click.echo(f"saga stopped for an operator: {view.failure}")
    _print_timeline(view)


def _no_history(conn: psycopg.Connection[Any], order_id: uuid.UUID, as_of: datetime | None) -> NoReturn:
    """Say why an order has no history to show (at that time): unknown, recorded later, or never recorded."""
    from estafeta_actors import order_history, orders

    first = order_history.first_recorded(conn, order_id)
    if first is not None and as_of is not None:
        raise click.ClickException(
            f"order {order_id} was not placed yet at {as_of.isoformat()} (placed {first.isoformat()})"
        )
    if orders.get_order(conn, order_id) is None:
        raise click.BadParameter(f"no order {order_id}", param_hint="ORDER_ID")
    raise click.ClickException(
        f"order {order_id} has no recorded history: it was placed before the orders service recorded events"
    )


def _print_counts(counts: dict[str, dict[str, int]], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(counts))
        return
    for kind, by_status in counts.items():
        click.echo(f"{kind}: " + (", ".join(f"{s} {n}" for s, n in by_status.items()) or "none"))


@orders_group.command("list")
@click.option("--status", type=click.Choice(["pending", "confirmed", "cancelled"]), help="Only orders in this status.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="At most this many.")
@_json_option
def list_command(status: str | None, limit: int, as_json: bool) -> None:
    """The newest orders first."""
    runtime = _ready()
    from estafeta_actors import orders

    with runtime.database("orders").connection() as conn:
        found = orders.list_orders(conn, status=status, limit=limit)
    if as_json:
        click.echo(json.dumps([_jsonable(attrs.asdict(o)) for o in found]))
        return
    echo_table(
        ("CREATED", "ORDER", "STATUS", "CUSTOMER", "QUANTITY", "SKU", "AMOUNT (CENTS)"),
        [
            (when(o.created_at), str(o.order_id), o.status, o.customer_id, o.quantity, o.sku, o.amount_cents)
            for o in found
        ],
        empty="no orders",
    )


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(data, default=str))  # type: ignore[no-any-return]


COMMANDS = [orders_group]
