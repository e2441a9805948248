"""The demo's summary: how the sagas ended, how fast, the duplicates, and the reconciliation.

The reconciliation is what makes the summary one an operator would trust: money, the
ledger, stock and every order checked against what was seeded. Apart from the command
(:mod:`estafeta_cli.demo`), which runs the orders: this reads their outcome, as JSON for scripts or
as the lines ``estafeta demo`` prints.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from estafeta import Runtime
    from estafeta_actors.order_saga import Reconciliation

    from .demo_harness import Harness
    from .seed import OrderPlan


def summary(
    runtime: Runtime, plan: OrderPlan, saga_ids: list[uuid.UUID], harness: Harness, absorbed: int | None
) -> dict[str, Any]:
    """The outcome of ``saga_ids``: counts by status, throughput and latency, duplicates, the reconciliation."""
    from estafeta_actors.order_saga import ORDER_SAGA, reconcile
    from estafeta_sql import saga_reports

    with runtime.database("orders").connection() as conn:
        outcomes = saga_reports.outcomes(conn, ORDER_SAGA.table, saga_ids)
        latency = saga_reports.latency(conn, ORDER_SAGA.table, saga_ids)
        order_ids = [
            r[0] for r in conn.execute("SELECT order_id FROM orders.saga_order WHERE saga_id = ANY(%s)", (saga_ids,))
        ]
    statuses = Counter(status for status, _ in outcomes)
    reasons = Counter(": ".join((e or "").split(": ")[:2]) for s, e in outcomes if s == "compensated")
    check = reconcile(runtime, order_ids, plan.balances, plan.stock)
    return {
        "orders": len(saga_ids),
        "completed": statuses["completed"],
        "compensated": statuses["compensated"],
        "failed": statuses["failed"],
        "gave_up": statuses["gave_up"],
        "unfinished": statuses["running"] + statuses["compensating"],
        "compensation_reasons": dict(reasons.most_common()),
        "sagas_per_second": latency.ended / latency.span if latency.span else None,
        "seconds": latency.span,
        "latency_p50": latency.p50,
        "latency_p99": latency.p99,
        "duplicates_published": harness.publisher.copies if harness.publisher else None,
        "duplicates_absorbed": absorbed,
        "reconciled": check.ok,
        "reconciliation": _reconciliation(check),
    }


def _reconciliation(check: Reconciliation) -> dict[str, Any]:
    return {
        "money_before": check.money_before,
        "money_now": check.money_now,
        "ledger_deposited": check.ledger_deposited,
        "ledger_now": check.ledger_now,
        "ledger_events": check.ledger_events,
        "projection_mismatches": check.projection_mismatches[:20],
        "stock_before": check.stock_before,
        "stock_now": check.stock_now,
        "mismatches": check.mismatches[:20],
    }


def report(s: dict[str, Any]) -> str:
    """The :func:`summary` as the lines ``estafeta demo`` prints, each check marked OK or MISMATCH."""
    r = s["reconciliation"]
    ok = {True: "OK", False: "MISMATCH"}
    lines = [
        f"completed     {s['completed']:>6}",
        f"compensated   {s['compensated']:>6}   "
        + ", ".join(f"{k}: {v}" for k, v in s["compensation_reasons"].items()),
        f"failed        {s['failed']:>6}" + ("   (see `estafeta sagas list --status failed`)" if s["failed"] else ""),
    ]
    if s.get("gave_up"):
        lines.append(f"gave up       {s['gave_up']:>6}   (see `estafeta sagas list --status gave_up`)")
    if s["unfinished"]:
        lines.append(f"unfinished    {s['unfinished']:>6}   (see `estafeta sagas list --stuck`)")
    if s["sagas_per_second"]:
        lines.append(
            f"throughput    {s['sagas_per_second']:>6.1f} sagas/s ({s['orders']} sagas in {s['seconds']:.2f} s)"
        )
        lines.append(f"latency       p50 {s['latency_p50']:.3f} s, p99 {s['latency_p99']:.3f} s (placed -> ended)")
    lines.append(_duplicates_line(s))
    lines += [
        "reconciliation",
        f"  money   {r['money_before']} cents seeded = {r['money_now']} in accounts + charged payments now"
        f"   {ok[r['money_before'] == r['money_now']]}",
        f"  ledger  {r['ledger_deposited']} cents opened and deposited in the ledger's events"
        f" = {r['ledger_now']} in the accounts replayed from {r['ledger_events']} events + charged payments now"
        f"   {ok[r['money_before'] == r['ledger_deposited'] == r['ledger_now']]}",
        "  accounts  every payments.accounts row equals its account replayed from the ledger"
        f"   {ok[not r['projection_mismatches']]}",
        *(f"    {m}" for m in r["projection_mismatches"]),
        f"  stock   {r['stock_before']} units seeded = {r['stock_now']} in stock + reserved now"
        f"   {ok[r['stock_before'] == r['stock_now']]}",
        "  orders  every completed order confirmed, charged once and reserved; every compensated one"
        f" cancelled with nothing charged or reserved   {ok[not r['mismatches']]}",
        *(f"    {m}" for m in r["mismatches"]),
    ]
    return "\n".join(lines)


def _duplicates_line(s: dict[str, Any]) -> str:
    published, absorbed = s["duplicates_published"], s["duplicates_absorbed"]
    if published is None:
        return "duplicates    not injected (the relay runs in another process)"
    line = f"duplicates    {published} message(s) published twice on purpose (a relay dying between publish and delete)"
    return line + (f"; {absorbed} absorbed by the inboxes" if absorbed is not None else "")
