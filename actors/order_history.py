"""The order's history as a read model: seed 003's ``OrderSummary``, and the order as it was at any time.

One fold (:func:`apply`) turns an order's events (:mod:`estafeta_actors.order_events`) into an
:class:`OrderView`: its status, amounts, the time of each milestone, why it was cancelled,
and the whole timeline. The :class:`OrderSummary` projection keeps that view per order
in ``orders.order_summary`` (gap-safe, like every estafeta projection: it may lag the
events, never skip one); :func:`as_of` folds the stream itself up to a time, so it works
for any time, also before the projection existed.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs
import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from estafeta import Projection, ProjectionContext, RecordedEvent

from . import orders
from .order_events import (
    EVENT_TYPES,
    STORE,
    CustomerNotified,
    OrderCancelled,
    OrderConfirmed,
    OrderPlaced,
    PaymentCharged,
    PaymentRefunded,
    PaymentRefused,
    SagaFailed,
    SagaResumed,
    StepAbandoned,
    StockRefused,
    StockReleased,
    StockReserved,
    record_transition,
    stream_id,
)

# record_transition is the order saga's hook (actors/order_saga.py takes it from here).
__all__ = ["OrderSummary", "OrderView", "Projected", "TimelineEntry", "as_of", "projected", "record_transition"]


@attrs.frozen
class TimelineEntry:
    """One fact of an order's history."""

    #: When it was recorded (the orders service learned it).
    at: datetime
    #: What happened: ``placed``, ``paid``, ``payment refused``, ``reserved``, ...
    what: str
    detail: str | None = None


@attrs.frozen
class OrderView:
    """An order as its events tell it (every milestone ``None`` until it happens)."""

    order_id: uuid.UUID
    #: What the order is for; ``None`` for an order placed before its history was recorded.
    customer_id: str | None = None
    sku: str | None = None
    quantity: int | None = None
    amount_cents: int | None = None
    #: ``pending``, ``confirmed`` or ``cancelled``.
    status: str = "pending"
    charged_cents: int = 0
    refunded_cents: int = 0
    placed_at: datetime | None = None
    paid_at: datetime | None = None
    reserved_at: datetime | None = None
    confirmed_at: datetime | None = None
    cancelled_at: datetime | None = None
    notified_at: datetime | None = None
    refunded_at: datetime | None = None
    released_at: datetime | None = None
    failed_at: datetime | None = None
    #: Why the order was cancelled (the saga's reason for compensating).
    cancel_reason: str | None = None
    #: Why its saga stopped for an operator, while it is stopped.
    failure: str | None = None
    #: Events applied: the order's stream version this view is at.
    version: int = 0
    timeline: tuple[TimelineEntry, ...] = ()


def order_id_of(stream: str) -> uuid.UUID:
    """The order id of an ``order-<order_id>`` stream."""
    kind, _, rest = stream.partition("-")
    if kind != "order":
        raise ValueError(f"stream {stream!r} is not an order's history")
    return uuid.UUID(rest)


def _effect(event: Any, at: datetime) -> tuple[str, str | None, dict[str, Any]]:
    """An event's timeline label and detail, and what it changes in the view."""
    match event:
        case OrderPlaced(customer_id=customer, sku=sku, quantity=quantity, amount_cents=amount):
            changes = {"customer_id": customer, "sku": sku, "quantity": quantity, "amount_cents": amount}
            return "placed", f"{quantity} x {sku} for {amount} cents by {customer}", {**changes, "placed_at": at}
        case PaymentCharged(amount_cents=amount):
            return "paid", f"{amount} cents charged", {"paid_at": at, "charged_cents": amount}
        case PaymentRefused(reason=reason):
            return "payment refused", reason, {}
        case StockReserved(sku=sku, quantity=quantity):
            return "reserved", f"{quantity} x {sku}", {"reserved_at": at}
        case StockRefused(reason=reason):
            return "stock refused", reason, {}
        case OrderConfirmed():
            return "confirmed", None, {"confirmed_at": at, "status": "confirmed"}
        case StepAbandoned(step=step, reason=reason):
            return "gave up", f"{step}: {reason}" if not reason.startswith(step) else reason, {}
        case PaymentRefunded(amount_cents=amount):
            return "refunded", f"{amount} cents", {"refunded_at": at, "refunded_cents": amount}
        case StockReleased(quantity=quantity):
            return "released", f"{quantity} unit(s)", {"released_at": at}
        case OrderCancelled(reason=reason):
            return "cancelled", reason, {"cancelled_at": at, "status": "cancelled", "cancel_reason": reason}
        case CustomerNotified(kind=kind):
            return "notified", f"order {kind}", {"notified_at": at}
        case SagaFailed(step=step, reason=reason):
            return "saga failed", f"at {step}: {reason}", {"failed_at": at, "failure": reason}
        case SagaResumed(step=step):
            return "resumed", f"at {step}", {"failure": None}
    raise TypeError(f"{type(event).__name__} is not an order-history event")


def apply(view: OrderView | None, recorded: RecordedEvent[Any]) -> OrderView:
    """The view after one more event of its order (an event it already has changes nothing)."""
    if view is None:
        view = OrderView(order_id_of(recorded.stream_id))
    if recorded.version <= view.version:
        return view
    what, detail, changes = _effect(recorded.event, recorded.recorded_at)
    entry = TimelineEntry(recorded.recorded_at, what, detail)
    return attrs.evolve(view, **changes, version=recorded.version, timeline=(*view.timeline, entry))


def fold(events: Sequence[RecordedEvent[Any]]) -> OrderView | None:
    """The view of one order's events, in stream order (``None`` for no event)."""
    view: OrderView | None = None
    for recorded in events:
        view = apply(view, recorded)
    return view


# -- the projection ----------------------------------------------------------------------

_COLUMNS = tuple(field.name for field in attrs.fields(OrderView))
_DDL = """CREATE TABLE {order_summary} (
    order_id uuid PRIMARY KEY,
    customer_id text, sku text, quantity int, amount_cents bigint,
    status text NOT NULL,
    charged_cents bigint NOT NULL, refunded_cents bigint NOT NULL,
    placed_at timestamptz, paid_at timestamptz, reserved_at timestamptz, confirmed_at timestamptz,
    cancelled_at timestamptz, notified_at timestamptz, refunded_at timestamptz, released_at timestamptz,
    failed_at timestamptz,
    cancel_reason text, failure text,
    version int NOT NULL,
    timeline jsonb NOT NULL,
    projected_at timestamptz NOT NULL
)"""


class OrderSummary(Projection):
    """Per order, in ``orders.order_summary``: its status, amounts, milestones, cancel reason and timeline.

    Its columns are :class:`OrderView`'s (the timeline as a JSON array of ``{at, what,
    detail}``), plus ``projected_at``: when the projector last wrote the row.

    A batch reads the summaries of the orders it touches in one query, folds the events
    into them and writes them back in one statement.
    """

    name = "order_summary"
    tables = {"order_summary": _DDL}
    event_types = EVENT_TYPES

    def apply_batch(self, ctx: ProjectionContext, events: Sequence[RecordedEvent[Any]]) -> None:
        """Fold ``events`` into the summaries of their orders (in the batch's transaction)."""
        table = ctx.table("order_summary")
        ids = list(dict.fromkeys(order_id_of(recorded.stream_id) for recorded in events))
        views = {view.order_id: view for view in _read(ctx.conn, table, ids)}
        for recorded in events:
            order_id = order_id_of(recorded.stream_id)
            views[order_id] = apply(views.get(order_id), recorded)
        columns = sql.SQL(", ").join(map(sql.Identifier, _COLUMNS))
        # projected_at: when the batch wrote the row, so lag = projected_at - the last event's time.
        upsert = sql.SQL(
            "INSERT INTO {} ({}, projected_at) VALUES ({}, clock_timestamp())"
            " ON CONFLICT (order_id) DO UPDATE SET {}, projected_at = excluded.projected_at"
        ).format(
            table,
            columns,
            sql.SQL(", ").join(sql.Placeholder(c) for c in _COLUMNS),
            sql.SQL(", ").join(sql.SQL("{0} = excluded.{0}").format(sql.Identifier(c)) for c in _COLUMNS[1:]),
        )
        with ctx.conn.cursor() as cur:
            cur.executemany(upsert, [_to_row(views[order_id]) for order_id in ids])


def _to_row(view: OrderView) -> dict[str, Any]:
    row = attrs.asdict(view, recurse=False)
    row["timeline"] = Jsonb([{"at": e.at.isoformat(), "what": e.what, "detail": e.detail} for e in view.timeline])
    return row


def _from_row(row: dict[str, Any]) -> OrderView:
    timeline = tuple(TimelineEntry(datetime.fromisoformat(e["at"]), e["what"], e["detail"]) for e in row["timeline"])
    return OrderView(**{**row, "timeline": timeline})


def _read(conn: psycopg.Connection[Any], table: sql.Composable, ids: list[uuid.UUID]) -> list[OrderView]:
    query = sql.SQL("SELECT {} FROM {} WHERE order_id = ANY(%s)").format(
        sql.SQL(", ").join(map(sql.Identifier, _COLUMNS)), table
    )
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, (ids,))
        return [_from_row(row) for row in cur.fetchall()]


#: The read model's table, as readers name it.
SUMMARY_TABLE = sql.Identifier(orders.SERVICE.name, OrderSummary.name)
orders.SERVICE.projection(OrderSummary())

# -- reading it --------------------------------------------------------------------------


@attrs.frozen
class Projected:
    """An order's summary as projected, and how far the projection is behind its events."""

    #: ``None`` when the projection has not applied any event of the order yet.
    view: OrderView | None
    #: The order's events not applied yet, and the age of the oldest of them.
    lag_events: int
    lag_seconds: float | None
    #: Whether the projection's table exists (a projector creates it when it first runs).
    built: bool = True


def projection_built(conn: psycopg.Connection[Any]) -> bool:
    """Whether the ``order_summary`` table exists (a projector creates it when it first runs)."""
    found = conn.execute("SELECT to_regclass('orders.order_summary') IS NOT NULL").fetchone()
    return bool(found and found[0])


def projected(conn: psycopg.Connection[Any], order_id: uuid.UUID) -> Projected:
    """The order's summary from the projection (``view=None`` if not there yet), with its lag."""
    built = projection_built(conn)
    found = _read(conn, SUMMARY_TABLE, [order_id]) if built else []
    view = found[0] if found else None
    lag = conn.execute(
        """SELECT count(*), extract(epoch FROM clock_timestamp() - min(recorded_at))
           FROM orders.events WHERE stream_id = %s AND version > %s""",
        (stream_id(order_id), view.version if view else 0),
    ).fetchone()
    assert lag is not None
    return Projected(view, int(lag[0]), None if lag[1] is None else float(lag[1]), built)


def as_of(conn: psycopg.Connection[Any], order_id: uuid.UUID, moment: datetime | None = None) -> OrderView | None:
    """The order as its events told it at ``moment`` (now if ``None``); ``None`` if it had no event by then."""
    return fold(STORE.read(conn, stream_id(order_id), as_of=moment))


def first_recorded(conn: psycopg.Connection[Any], order_id: uuid.UUID) -> datetime | None:
    """When the order's first event was recorded; ``None`` if it has none."""
    found = STORE.read(conn, stream_id(order_id), up_to_version=1)
    return found[0].recorded_at if found else None


# -- checking it -------------------------------------------------------------------------

_COUNTS = """SELECT stream_id, type || coalesce(':' || (data ->> 'kind'), ''), count(*)
               FROM orders.events WHERE stream_id = ANY(%s) GROUP BY 1, 2"""
#: What the history of an order whose saga ended must hold exactly once, and must not hold.
_ONCE = {
    "completed": ("OrderPlaced", "PaymentCharged", "StockReserved", "OrderConfirmed", "CustomerNotified:confirmed"),
    "compensated": ("OrderPlaced", "OrderCancelled", "CustomerNotified:cancelled"),
}
_NEVER = {
    "completed": ("OrderCancelled", "PaymentRefunded", "StockReleased", "CustomerNotified:cancelled"),
    "compensated": ("OrderConfirmed", "CustomerNotified:confirmed"),
}
#: A compensated order's history holds each of these at most once, and its undoing if it holds it.
_UNDONE = {"PaymentCharged": "PaymentRefunded", "StockReserved": "StockReleased"}


def disagreements(conn: psycopg.Connection[Any], outcomes: Mapping[uuid.UUID, str]) -> list[str]:
    """Orders whose history disagrees with how their saga ended (``completed``, ``compensated``), with why.

    Every fact must be recorded exactly once, whatever crashed and was redelivered on the
    way; sagas still live (or ``failed``) are not checked.
    """
    ids = [order_id for order_id, status in outcomes.items() if status in _ONCE]
    counts: dict[str, dict[str, int]] = {stream_id(order_id): {} for order_id in ids}
    for stream, kind, count in conn.execute(_COUNTS, ([stream_id(i) for i in ids],)).fetchall():
        counts[stream][kind] = int(count)
    found = []
    for order_id in ids:
        status, seen = outcomes[order_id], counts[stream_id(order_id)]
        wrong = [f"{kind} x{seen.get(kind, 0)}" for kind in _ONCE[status] if seen.get(kind, 0) != 1]
        wrong += [f"{kind} x{seen[kind]}" for kind in _NEVER[status] if seen.get(kind)]
        if status == "compensated":
            wrong += [f"{kind} x{n}" for kind, n in seen.items() if kind in (*_UNDONE, *_UNDONE.values()) and n > 1]
            wrong += [
                f"{done} without {undo}" for done, undo in _UNDONE.items() if seen.get(done) and not seen.get(undo)
            ]
        if wrong:
            found.append(f"order {order_id}: saga {status}, its history has {', '.join(wrong)}")
    return found
