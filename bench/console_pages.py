"""``python -m bench.console_pages``: each console page on 1,000 sagas, served and drawn in headless Chromium.

A scratch database gets the order system's tables and ``--sagas`` order sagas: a few
real ones driven through their steps by hand (completed, compensated, compensating,
running, failed), the rest made by ``generate_series`` in the same mix, with a dead
letter, a failed outbox row, a scheduled message and the order-summary projection run
once. ``estafeta serve`` serves the console on it; each page is read ``--repeat`` times
over HTTP (the server's time: the whole response) and loaded as many times in Debian's
headless Chromium through chromedriver (navigation start to the load event: the page
laid out and drawn, its clock script run). Then every saga on one list page (the console
pages by 50): the list read and its template drawn, loaded from a file in Chromium.
Medians are printed beside the budget: a page in under a second.

``scripts/console_screenshots.py`` takes the documentation's pictures on the same data.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.types.json import Jsonb

from estafeta import Runtime, Settings

from .common import add_database_url, describe, machine, scratch_database

ROOT = Path(__file__).resolve().parent.parent
#: The budget of a page with 1,000 sagas.
BUDGET_MS = 1000.0
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
#: The rest of the sagas, in the mix of the real ones (mostly completed), over the last day.
FILL = """
INSERT INTO orders.saga_order (saga_id, order_id, status, current_step, payload, step_timeout, started_at,
                               deadline_at, completed_at, last_error)
SELECT gen_random_uuid(), gen_random_uuid(), s.status,
       CASE s.status WHEN 'completed' THEN 'notify_customer' WHEN 'running' THEN 'charge_payment'
                     WHEN 'failed' THEN 'confirm_order' ELSE 'place_order' END,
       '{"customer_id": "c1", "sku": "s1", "quantity": 1, "amount_cents": 700}', '30 s',
       now() - n * interval '80 seconds',
       CASE WHEN s.status IN ('running', 'compensating') THEN now() + interval '30 seconds' END,
       CASE WHEN s.status IN ('completed', 'compensated', 'failed') THEN now() - n * interval '80 seconds' END,
       CASE s.status WHEN 'compensated' THEN 'insufficient funds'
                     WHEN 'failed' THEN 'confirm_order: orders service: connection refused' END
FROM generate_series(1, %(rows)s) AS n,
     LATERAL (SELECT CASE WHEN mod(n, 97) = 0 THEN 'failed' WHEN mod(n, 61) = 0 THEN 'running'
                          WHEN mod(n, 11) = 0 THEN 'compensated' ELSE 'completed' END AS status) AS s
"""


def prepare(dsn: str) -> None:
    """The tests' app's tables (the order system's and the probe's: the courier reads every outbox)."""
    from tests.app import app as tests_app

    runtime = Runtime(Settings(database_url=dsn))
    try:
        tests_app.migrate(runtime)
    finally:
        runtime.close()


def fill(dsn: str, sagas: int) -> dict[str, str]:
    """Sagas in every state (real ones first), a dead letter, a failed row, a scheduled message; their ids."""
    from estafeta import Projector
    from estafeta_actors.app import app as order_system
    from estafeta_actors.order_events import STORE, stream_id
    from estafeta_actors.order_history import OrderSummary
    from estafeta_actors.payments import ChargePayment
    from tests.shop import Courier, place, seed

    runtime = Runtime(Settings(database_url=dsn))
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            seed(runtime, {"rich": 10_000_000, "poor": 100}, {"s1": 10_000})
            courier, made = Courier(runtime, conn), {}
            for n in range(3):
                made["completed"] = place(runtime, "rich", "s1", 1, 3_000 + n)
                courier.run()
            made["compensated"] = place(runtime, "poor", "s1", 1, 3_000)
            courier.run()
            made["compensating"] = place(runtime, "poor", "s1", 1, 3_000)
            courier.run(hold=frozenset({"orders.cancel_order"}))
            made["running"] = place(runtime, "rich", "s1", 1, 3_000)
            made["failed"] = place(runtime, "rich", "s1", 1, 3_000)
            failed = "UPDATE orders.saga_order SET status = 'failed', last_error = %s WHERE saga_id = %s"
            conn.execute(failed, ("charge_payment: payments service: connection refused", made["failed"].saga_id))
            conn.execute(FILL, {"rows": max(0, sagas - 7)})
            conn.execute(
                "INSERT INTO payments.dead_letters (consumer, message_id, message, reason) VALUES (%s, %s, %s, %s)",
                (
                    "payments.charge_payment",
                    str(uuid.uuid4()),
                    Jsonb({"args": [{"order_id": str(uuid.uuid4()), "customer_id": "c9", "amount_cents": 100}]}),
                    "failed 4 times, last: OSError: disk full",
                ),
            )
            conn.execute(
                "UPDATE orders.outbox SET status = 'failed', attempts = 5, last_error = 'connection refused'"
                " WHERE actor_name = 'orders.cancel_order'"
            )
            with conn.transaction():
                later = datetime.now(UTC) + timedelta(hours=2)
                order_system.service("orders").send(conn, ChargePayment(uuid.uuid4(), "rich", 500), at=later)
            projector = Projector(OrderSummary(), STORE)
            projector.create_tables(conn)
            with conn.transaction():
                projector.run_batch(conn)
            conn.execute("VACUUM ANALYZE orders.saga_order")
        ids = {status: str(order.saga_id) for status, order in made.items()}
        return {**ids, "stream": stream_id(made["compensated"].order_id)}
    finally:
        runtime.close()


@contextlib.contextmanager
def serving(dsn: str) -> Iterator[str]:
    """``estafeta serve`` (read-only console) on ``dsn``; yields its URL."""
    with socket_port() as port:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ESTAFETA_")}
        env.update(ESTAFETA_DATABASE_URL=dsn, ESTAFETA_BROKER_URL="stub://", PYTHONPATH=str(ROOT))
        argv = [sys.executable, "-m", "estafeta_cli", "serve", "--port", str(port), "--no-access-log"]
        server = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _healthy(url):
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("estafeta serve did not start")
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(30)


@contextlib.contextmanager
def socket_port() -> Iterator[int]:
    """A free port on loopback (closed before the server binds it)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    yield port


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@contextlib.contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """Debian's headless Chromium through chromedriver, with a profile of its own."""
    import tempfile

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        raise SystemExit("needs Debian's chromium and chromium-driver (make system-deps)")
    with tempfile.TemporaryDirectory() as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in [*FLAGS, f"--window-size={width},{height}", f"--user-data-dir={profile}"]:
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
        try:
            yield driver
        finally:
            driver.quit()


#: Milliseconds from the start of the navigation to the end of the load event (laid out, drawn, scripts run).
_LOADED = "const n = performance.getEntriesByType('navigation')[0]; return n.loadEventEnd - n.startTime"


def pages(ids: dict[str, str]) -> dict[str, str]:
    """The pages measured, by what they show."""
    return {
        "overview": "/console",
        "saga list (every saga)": "/console/sagas",
        "saga list, completed": "/console/sagas?kind=order&status=completed",
        "a compensated saga": f"/console/sagas/{ids['compensated']}",
        "the order saga's diagram": "/console/kinds/order",
        "failed outbox rows": "/console/outbox/failed",
        "projections": "/console/projections",
        "event streams": "/console/events",
        "scheduled messages": "/console/outbox/scheduled",
        "charts (the frame)": "/console/charts/frame?window=60",
    }


def measure(url: str, path: str, browser: Any, repeat: int) -> dict[str, float]:
    """Median ms of ``path`` served (over HTTP) and loaded in Chromium, and the page's size."""
    served, loaded, size = [], [], 0
    with httpx.Client(base_url=url, timeout=30) as http:
        for _ in range(repeat + 1):  # the first warms the server's pool and caches
            started = time.perf_counter()
            size = len(http.get(path).content)
            served.append((time.perf_counter() - started) * 1000)
    for _ in range(repeat + 1):
        browser.get(url + path)
        loaded.append(browser.execute_script(_LOADED))
    return {"served_ms": statistics.median(served[1:]), "loaded_ms": statistics.median(loaded[1:]), "bytes": size}


def all_on_one_page(dsn: str, browser: Any, repeat: int, tmp: Path) -> dict[str, float]:
    """Every saga of the database on one list page (the console shows 50 a page): read and drawn, then loaded.

    The same code as ``/console/sagas`` (``read_saga_list`` and its template), asked for a
    page as long as the table, written to a file and loaded in Chromium.
    """
    from estafeta_actors.app import app as order_system
    from estafeta_console.data import lists as console_lists
    from estafeta_console.pages.routes import Console

    runtime = Runtime(Settings(database_url=dsn))
    try:
        console = Console(order_system, runtime)
        query = console_lists.parse_saga_query(order_system, {})
        drawn, page = [], ""
        for _ in range(repeat + 1):
            started = time.perf_counter()
            listed = console_lists.read_saga_list(order_system, runtime, query, page=100_000)
            page = bytes(console.saga_list_html(listed).body).decode()
            drawn.append((time.perf_counter() - started) * 1000)
    finally:
        runtime.close()
    target = tmp / "sagas.html"
    target.write_text(page)
    loaded = []
    for _ in range(repeat + 1):
        browser.get(target.as_uri())
        loaded.append(browser.execute_script(_LOADED))
    rows = browser.execute_script("return document.querySelectorAll('#saga-list tr[id^=saga-]').length")
    return {
        "served_ms": statistics.median(drawn[1:]),
        "loaded_ms": statistics.median(loaded[1:]),
        "bytes": len(page.encode()),
        "rows": rows,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    with scratch_database(args.database_url, prepare) as dsn, tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        ids = fill(dsn, args.sagas)
        filled = time.perf_counter() - started
        with serving(dsn) as url, chromium() as browser:
            found = {name: measure(url, path, browser, args.repeat) for name, path in pages(ids).items()}
            every = all_on_one_page(dsn, browser, args.repeat, Path(tmp))
            found[f"all {every.pop('rows')} sagas on one list page"] = every
    return {"sagas": args.sagas, "fill_seconds": round(filled, 1), "pages": found}


def table(found: dict[str, Any]) -> str:
    """The figures, one page a line, beside the budget."""
    lines = [
        f"console pages on {found['sagas']:,} sagas (filled in {found['fill_seconds']} s); median ms;"
        f" budget {BUDGET_MS:.0f} ms a page",
        f"{'page':<34} {'served':>8} {'in Chromium':>12} {'KiB':>6}  vs budget",
    ]
    for name, figures in found["pages"].items():
        verdict = "within" if figures["loaded_ms"] < BUDGET_MS else "OVER"
        lines.append(
            f"{name:<34} {figures['served_ms']:>8.1f} {figures['loaded_ms']:>12.1f}"
            f" {figures['bytes'] / 1024:>6.1f}  {verdict}"
        )
    lines.append(describe(machine()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.console_pages", description=__doc__.split("\n")[0])
    parser.add_argument("--sagas", type=int, default=1000, help="sagas in the database (default 1,000)")
    parser.add_argument("--repeat", type=int, default=5, help="loads of each page (default 5; the median is shown)")
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
