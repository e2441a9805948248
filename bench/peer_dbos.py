"""DBOS Transact running the order saga (bench/dbos_orders.py), measured as ``bench.sagas`` measures estafeta's.

DBOS keeps its workflows, queue and checkpoints in a system database of its own: this module
creates one on the benchmark's PostgreSQL server for the run and drops it afterwards. The
workflow's steps write the order-system tables of the benchmark's database (DBOS's step
checkpoints go beside them, in a ``dbos`` schema, in the same transactions).

For each shape, ``count`` orders are planned as estafeta's are (the same accounts, stock and
refusal mix, under customers and SKUs of their own), their order rows inserted in one
transaction, and their workflows enqueued in one transaction of the system database once
every executor listens. Sagas per second, latency p50/p99 from enqueueing to the end, and
the machine's CPU per saga come from DBOS's own timestamps and ``/proc``, as estafeta's do.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from . import cpu
from .common import scratch_database, stop

if TYPE_CHECKING:
    from estafeta import Runtime

ROOT = Path(__file__).resolve().parents[1]

#: The queue and the workflow's registered name (bench/dbos_orders.py registers them).
QUEUE = "bench_orders"
WORKFLOW = "order_saga"
#: Every executor and the client agree on this, so any executor may run any workflow.
APP_VERSION = "bench"


def sqlalchemy_url(dsn: str) -> str:
    """A ``postgresql://`` URL for a libpq DSN (DBOS takes URLs only)."""
    import sqlalchemy as sa

    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    url = sa.URL.create(
        "postgresql",
        username=str(parts.get("user") or "") or None,
        password=str(parts.get("password") or "") or None,
        host=str(parts.get("host") or "") or None,
        port=int(str(parts["port"])) if parts.get("port") else None,
        database=str(parts.get("dbname") or "") or None,
    )
    return url.render_as_string(hide_password=False)


@contextlib.contextmanager
def system_database(admin_dsn: str) -> Iterator[str]:
    """DBOS's system database for the run (created, migrated, dropped afterwards); yields its URL."""
    from dbos import DBOS

    with scratch_database(admin_dsn, lambda dsn: DBOS.migrate(sqlalchemy_url(dsn))) as dsn:
        yield sqlalchemy_url(dsn)


def dbos_sagas(
    admin_dsn: str, dsn: str, runtime: Runtime, count: int, shapes: list[int], concurrency: int = 8
) -> dict[str, Any]:
    """The order saga on DBOS in ``processes`` executors for each of ``shapes``, ``count`` orders each."""
    from dbos import SQLAlchemyDatasource

    SQLAlchemyDatasource.migrate(sqlalchemy_url(dsn))  # its checkpoint table, beside the steps' tables
    found: dict[str, Any] = {}
    with system_database(admin_dsn) as system_url:
        for processes in shapes:
            with executors(system_url, sqlalchemy_url(dsn), processes, concurrency):
                found[str(processes)] = measure(runtime, system_url, count) | {"processes": processes}
    return found


@contextlib.contextmanager
def executors(system_url: str, app_url: str, processes: int, concurrency: int) -> Iterator[None]:
    """``processes`` DBOS executors (``python -m bench.dbos_orders``), each listening to the queue."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BENCH_DBOS_SYSTEM_URL": system_url,
           "BENCH_DBOS_APP_URL": app_url, "BENCH_DBOS_CONCURRENCY": str(concurrency)}  # fmt: skip
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.dbos_orders"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(processes)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a DBOS executor exited ({child.wait()}) before it listened to the queue")
        yield
    finally:
        stop(children)


def measure(runtime: Runtime, system_url: str, count: int) -> dict[str, Any]:
    """``count`` order workflows enqueued at once: sagas per second, latency, machine CPU per saga."""
    import sqlalchemy as sa
    from dbos import DBOSClient

    from estafeta_actors import orders
    from estafeta_cli.seed import plan_orders, seed_services

    tag = f"d{uuid.uuid4().hex[:6]}-"
    plan = plan_orders(count, prefix=tag, rng=random.Random(7))
    seed_services(runtime, plan.balances, plan.stock)
    placed: list[dict[str, Any]] = []
    with runtime.database("orders").transaction() as conn:
        for customer, sku, quantity, amount in plan.orders:
            order_id = uuid.uuid4()
            orders.insert_order(conn, order_id, customer_id=customer, sku=sku, quantity=quantity,
                                amount_cents=amount, idempotency_key=None)  # fmt: skip
            placed.append({"order_id": str(order_id), "customer_id": customer, "sku": sku,
                           "quantity": quantity, "amount_cents": amount})  # fmt: skip
    client = DBOSClient(system_database_url=system_url)
    engine = sa.create_engine(sa.make_url(system_url).set(drivername="postgresql+psycopg"))
    busy, by_group = cpu.busy_seconds(), cpu.cpu_by_process_group()
    try:
        with engine.begin() as conn:
            for order in placed:
                options = {"queue_name": QUEUE, "workflow_name": WORKFLOW, "app_version": APP_VERSION,
                           "workflow_id": tag + order["order_id"]}  # fmt: skip
                client.enqueue_in_transaction(conn, options, order)  # type: ignore[arg-type]
        row = _wait_for_workflows(engine, tag, count)
    finally:
        busy, after = cpu.busy_seconds() - busy, cpu.cpu_by_process_group()
        client.destroy()
        engine.dispose()
    with runtime.database("orders").connection() as conn:
        completed = conn.execute(
            "SELECT count(*) FROM orders.orders WHERE order_id = ANY(%s) AND status = 'confirmed'",
            ([uuid.UUID(o["order_id"]) for o in placed],),
        ).fetchone()
    seconds = float(row[0])
    return {
        "sagas": count,
        # The customers' and SKUs' prefix: plan_orders(count, prefix=tag, rng=random.Random(7)) again.
        "tag": tag,
        "completed": int(completed[0]) if completed else 0,
        "errors": int(row[3]),
        "seconds": seconds,
        "sagas_per_second": count / seconds,
        "latency_p50": float(row[1]),
        "latency_p99": float(row[2]),
        # Everything the machine did while the workflows ran (other work too, on a busy machine).
        "cpu_ms_per_saga": 1000 * busy / count,
        "cpu_ms_per_saga_by_process": {
            group: 1000 * (after[group] - by_group.get(group, 0.0)) / count
            for group in sorted(after, key=lambda g: by_group.get(g, 0.0) - after[g])
            if after[group] - by_group.get(group, 0.0) > 0
        },
    }


def _wait_for_workflows(engine: Any, tag: str, count: int, timeout: float = 600) -> Any:
    import sqlalchemy as sa

    ended = sa.text(
        "SELECT count(*) FROM dbos.workflow_status WHERE workflow_uuid LIKE :t AND status IN ('SUCCESS', 'ERROR')"
    )
    deadline = time.monotonic() + timeout
    with engine.connect() as conn:
        while (conn.execute(ended, {"t": tag + "%"}).scalar() or 0) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"DBOS did not finish {count} order workflows within {timeout:g} s")
            conn.rollback()
            time.sleep(0.05)
        return conn.execute(
            sa.text(
                """SELECT (max(ended) - min(created_at)) / 1000.0,
                          percentile_cont(0.5) WITHIN GROUP (ORDER BY (ended - created_at) / 1000.0),
                          percentile_cont(0.99) WITHIN GROUP (ORDER BY (ended - created_at) / 1000.0),
                          count(*) FILTER (WHERE status = 'ERROR')
                   FROM (SELECT created_at, coalesce(completed_at, updated_at) AS ended, status
                         FROM dbos.workflow_status WHERE workflow_uuid LIKE :t) AS w"""
            ),
            {"t": tag + "%"},
        ).first()
