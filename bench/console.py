"""``python -m bench.console``: one page of the console's saga list on 1,000,000 sagas, with and without its indexes.

A scratch database gets the order system's tables and ``--rows`` order sagas made by
``generate_series``, a saga a second, skewed as a real table is: most completed, one in
50 compensated, a few running, one in 400 waiting on ``confirm_order``, none on
``reserve_inventory``, and failed ones (one in 500) only in the oldest tenth (an incident
days ago). Each list the console serves (no filter, by status, by step, by status and
step, a time range, an error text, and a page deep down the list reached by its keyset
cursor) is read a page at a time (51 rows, as the console asks for), ``--repeat`` times;
the median is printed. Then the list indexes and statistics
(``sql/migrations/_saga/0002_list_indexes.sql``) are dropped, the index of the release
before (``started_at``) put back, and the same pages read again. For comparison, the deep
page is also read with ``OFFSET`` (what the console never does).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from estafeta import Runtime, Settings
from estafeta_actors.app import app as order_system
from estafeta_actors.order_saga import ORDER_SAGA
from estafeta_sql import saga_reports

from .common import add_database_url, describe, machine, scratch_database

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PAGE = 51
FILL = """
INSERT INTO orders.saga_order (saga_id, order_id, status, current_step, payload, step_timeout, started_at, last_error)
SELECT gen_random_uuid(), gen_random_uuid(),
       CASE WHEN mod(n, 500) = 0 AND n < %(rows)s / 10 THEN 'failed' WHEN mod(n, 2500) = 5 THEN 'running'
            WHEN mod(n, 50) = 3 THEN 'compensated' ELSE 'completed' END,
       CASE WHEN mod(n, 400) = 1 THEN 'confirm_order' WHEN mod(n, 50) = 3 THEN 'charge_payment'
            ELSE 'notify_customer' END,
       '{"customer_id": "c1"}', '30 s', %(t0)s + n * interval '1 second',
       CASE WHEN mod(n, 500) = 0 AND n < %(rows)s / 10 THEN 'payment service: connection refused'
            WHEN mod(n, 50) = 3 THEN 'insufficient funds' END
FROM generate_series(1, %(rows)s) AS n
"""
WITHOUT = """
DROP INDEX orders.saga_order_newest, orders.saga_order_status_newest, orders.saga_order_step_newest;
DROP STATISTICS orders.saga_order_status_step;
CREATE INDEX saga_order_started_at ON orders.saga_order (started_at);
"""


def _migrate(dsn: str) -> None:
    runtime = Runtime(Settings(database_url=dsn))
    try:
        order_system.migrate(runtime)
    finally:
        runtime.close()


def lists(conn: psycopg.Connection[Any], rows: int) -> dict[str, saga_reports.ListFilter]:
    """The lists measured; the deep one starts halfway down the whole list."""
    middle = conn.execute(
        "SELECT started_at, saga_id FROM orders.saga_order ORDER BY started_at DESC, saga_id DESC OFFSET %s LIMIT 1",
        (rows // 2,),
    ).fetchone()
    assert middle is not None
    halfway = T0 + timedelta(seconds=rows // 2)  # a saga a second
    return {
        "newest first, no filter": saga_reports.ListFilter(),
        "status=failed": saga_reports.ListFilter(status="failed"),
        "status=running": saga_reports.ListFilter(status="running"),
        "step=confirm_order": saga_reports.ListFilter(step="confirm_order"),
        "step=reserve_inventory (no saga waits there)": saga_reports.ListFilter(step="reserve_inventory"),
        "status=compensated, step=charge_payment": saga_reports.ListFilter(status="compensated", step="charge_payment"),
        "a 3-hour range, halfway": saga_reports.ListFilter(since=halfway, until=halfway + timedelta(hours=3)),
        "error contains 'refused'": saga_reports.ListFilter(error="refused"),
        "status=failed, error 'refused'": saga_reports.ListFilter(status="failed", error="refused"),
        f"page after row {rows // 2:,} (cursor)": saga_reports.ListFilter(after=(middle[0], middle[1])),
    }


def page_ms(conn: psycopg.Connection[Any], where: saga_reports.ListFilter, repeat: int) -> tuple[float, int]:
    """The median milliseconds of one page, and how many rows it had."""
    times, found = [], 0
    for _ in range(repeat + 1):  # the first read warms the cache
        started = time.perf_counter()
        found = len(saga_reports.list_page(conn, ORDER_SAGA.table, where, PAGE))
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times[1:]), found


def offset_ms(conn: psycopg.Connection[Any], offset: int, repeat: int) -> float:
    times = []
    statement = "SELECT * FROM orders.saga_order ORDER BY started_at DESC, saga_id DESC OFFSET %s LIMIT %s"
    for _ in range(repeat + 1):
        started = time.perf_counter()
        conn.execute(statement, (offset, PAGE)).fetchall()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times[1:])


def run(args: argparse.Namespace) -> dict[str, Any]:
    with scratch_database(args.database_url, _migrate) as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        started = time.perf_counter()
        conn.execute(FILL, {"t0": T0, "rows": args.rows})
        conn.execute("VACUUM ANALYZE orders.saga_order")
        fill_seconds = time.perf_counter() - started
        measured = lists(conn, args.rows)
        results = {name: {"with": page_ms(conn, where, args.repeat)} for name, where in measured.items()}
        offset_with = offset_ms(conn, args.rows // 2, args.repeat)
        conn.execute(WITHOUT)
        conn.execute("ANALYZE orders.saga_order")
        for name, where in measured.items():
            results[name]["without"] = page_ms(conn, where, args.repeat)
    return {
        "rows": args.rows,
        "fill_seconds": round(fill_seconds, 1),
        "lists": {
            name: {
                "rows_on_page": found["with"][1],
                "ms_with_indexes": round(found["with"][0], 2),
                "ms_without": round(found["without"][0], 2),
            }
            for name, found in results.items()
        },
        "offset_ms_with_indexes": round(offset_with, 1),
    }


def table(found: dict[str, Any]) -> str:
    """The figures, one list a line."""
    lines = [
        f"one page ({PAGE} rows) of the console's saga list, {found['rows']:,} sagas (filled in"
        f" {found['fill_seconds']} s); median ms",
        f"{'list':<46} {'rows':>5} {'with indexes':>13} {'without':>10}",
    ]
    for name, figures in found["lists"].items():
        with_, without = figures["ms_with_indexes"], figures["ms_without"]
        lines.append(f"{name:<46} {figures['rows_on_page']:>5} {with_:>13.2f} {without:>10.2f}")
    lines.append(
        f"the same deep page by OFFSET {found['rows'] // 2:,} (never used): {found['offset_ms_with_indexes']} ms"
    )
    lines.append(describe(machine()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.console", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="sagas in the table (default 1,000,000)")
    parser.add_argument("--repeat", type=int, default=9, help="reads of each page (default 9; the median is shown)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    add_database_url(parser)
    args = parser.parse_args(argv)
    found = run(args)
    if args.json:
        json.dump({"machine": machine(), **found}, sys.stdout, indent=2)
        print()
    else:
        print(table(found))


if __name__ == "__main__":
    main()
