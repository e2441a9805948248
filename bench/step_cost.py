"""What one step delivery costs the database: statements, round trips and commits, per actor.

    python -m bench.step_cost [--orders 20] [--pings 20]
    python -m bench.step_cost --orm 200     # what an ORM session in a step adds (bench/orm_steps.py)
    python -m bench.step_cost --django 200  # what Django's connection and ORM add (bench/django_steps.py)

Deliveries run one at a time in this process (the order system's steps, a hand-driven
courier moving outbox rows to them) on a pool of one connection per database, whose libpq
trace (``PQtrace``) is read back per delivery:

- statements: ``Bind`` and simple ``Query`` messages the client sent;
- round trips: times the client waited for the server (``Sync`` and ``Query`` messages: in
  pipeline mode several statements share one);
- commits: ``COMMIT`` commands completed, plus statements that wrote outside a transaction
  block (autocommit); ``async`` counts those run with ``synchronous_commit = off``, which
  do not wait for the WAL flush.

Counts, not times: they are the same on a busy machine and a quiet one.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import psycopg
from psycopg import sql as pgsql
from psycopg.rows import dict_row

from estafeta import Runtime, Settings, deliver
from estafeta_actors import inventory, payments, pingpong
from estafeta_actors.app import app
from estafeta_actors.order_saga import place_order
from estafeta_brokers.publish import to_message
from estafeta_sql.outbox import OutboxRow

from .common import scratch_database

ADMIN_DSN = os.environ.get("ESTAFETA_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@attrs.define
class Cost:
    """Totals over the deliveries of one actor."""

    deliveries: int = 0
    statements: int = 0
    round_trips: int = 0
    commits: int = 0
    async_commits: int = 0

    def add(self, other: Cost) -> None:
        self.deliveries += other.deliveries
        self.statements += other.statements
        self.round_trips += other.round_trips
        self.commits += other.commits
        self.async_commits += other.async_commits


def read_trace(lines: list[str]) -> Cost:
    """Count one delivery's statements, round trips and commits from its libpq trace lines."""
    cost = Cost(deliveries=1)
    in_block = False
    wrote = False
    async_next = False
    last_kind = ""
    for line in lines:
        parts = line.split("\t")
        if len(parts) < 3 or parts[0] not in ("F", "B"):
            # The rest of a multi-line statement's text.
            if last_kind in ("Parse", "Query") and "synchronous_commit" in line:
                async_next = True
            continue
        last_kind = parts[2]
        direction, kind = parts[0], parts[2]
        text = "\t".join(parts[3:])
        if direction == "F":
            if kind in ("Bind", "Query"):
                cost.statements += 1
            if kind in ("Sync", "Query"):
                cost.round_trips += 1
            if kind in ("Parse", "Query") and "synchronous_commit" in text:
                async_next = True
        elif direction == "B":
            if kind == "CommandComplete":
                tag = text.strip().strip('"')
                if tag == "COMMIT":
                    cost.commits += 1
                    cost.async_commits += async_next
                    async_next = False
                elif tag.split(" ")[0] in ("INSERT", "UPDATE", "DELETE", "MERGE"):
                    wrote = True
            elif kind == "ReadyForQuery":
                status = text.strip()
                if status == "I" and not in_block and wrote:
                    cost.commits += 1  # an autocommit write
                    cost.async_commits += async_next
                    async_next = False
                if status == "I":
                    async_next = False
                in_block = status in ("T", "E")
                wrote = False if status == "I" else wrote
    return cost


class Tracer:
    """The libpq trace of the one pooled connection of each database of ``runtime``."""

    def __init__(self, runtime: Runtime, services: list[str], folder: Path) -> None:
        self.files: dict[str, Path] = {}
        self.conns: list[psycopg.Connection[Any]] = []
        self.folder = folder
        self.runtime = runtime
        self.services = services

    def start(self) -> None:
        for service in self.services:
            database = self.runtime.database(service)
            with database.connection() as conn:
                # Unprepared: every statement's text is in the trace.
                conn.prepare_threshold = None
                path = self.folder / f"{service}.trace"
                path.touch()
                self.files[service] = path
                self.conns.append(conn)

    def read(self, service: str, deliver_once: Any) -> tuple[Any, list[str]]:
        path = self.files[service]
        database = self.runtime.database(service)
        with path.open("a") as out:
            with database.connection() as conn:
                conn.pgconn.trace(out.fileno())
                conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
            try:
                result = deliver_once()
            finally:
                with database.connection() as conn:
                    conn.pgconn.untrace()
        lines = path.read_text().splitlines()
        path.write_text("")
        # The pool's own checks when handing the connection out and back are not the step's.
        return result, lines


def _pending(conn: psycopg.Connection[Any]) -> Iterator[tuple[str, OutboxRow]]:
    for service in app.services:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(
                pgsql.SQL(
                    "DELETE FROM {}.outbox WHERE id = (SELECT min(id) FROM {}.outbox WHERE status = 'pending')"
                    " RETURNING id, message_id, queue_name, actor_name, message, ordering_key, saga_id,"
                    " created_at, attempts"
                ).format(pgsql.Identifier(service.name), pgsql.Identifier(service.name))
            )
            for row in cur.fetchall():
                yield service.name, OutboxRow.from_row(row)


def run(orders: int, pings: int, admin: str = ADMIN_DSN) -> dict[str, Cost]:
    """Deliver ``pings`` ping/pongs and ``orders`` whole order sagas; return the cost per actor.

    ``admin``: the server to create the scratch database on.
    """

    def prepare(dsn: str) -> None:
        runtime = Runtime(Settings(database_url=dsn))
        runtime.migrate(app.services)
        runtime.close()

    costs: dict[str, Cost] = collections.defaultdict(Cost)
    with scratch_database(admin, prepare) as dsn, tempfile.TemporaryDirectory() as folder:
        runtime = Runtime(Settings(database_url=dsn, pool_size=1))
        steps = app.steps
        owner = {spec.actor_name: spec.service for spec in steps.values()}
        tracer = Tracer(runtime, [s.name for s in app.services], Path(folder))
        tracer.start()
        with psycopg.connect(dsn, autocommit=True) as courier:
            with courier.transaction():
                payments.open_accounts(courier, {f"c{i}": 10**9 for i in range(orders)})
                inventory.add_stock(courier, {"sku-1": 10**9})
            for _ in range(pings):
                with courier.transaction():
                    pingpong.send_ping(courier)
            for i in range(orders):
                with courier.transaction():
                    place_order(courier, customer_id=f"c{i}", sku="sku-1", quantity=1, amount_cents=100)
            while True:
                batch = list(_pending(courier))
                if not batch:
                    break
                for _, row in batch:
                    message = to_message(row)
                    spec = steps[row.actor_name]
                    _, lines = tracer.read(owner[row.actor_name], functools.partial(deliver, spec, runtime, message))
                    costs[row.actor_name].add(read_trace(lines))
        runtime.close()
    return dict(costs)


def run_orm(deliveries: int) -> tuple[dict[str, Cost], dict[str, tuple[float, float]]]:
    """Deliver ``deliveries`` messages to each step of :mod:`bench.orm_steps`; return the cost and times per actor.

    The times are the median wall time of a delivery and its median CPU time in this process
    (the CPU time is what a loaded machine changes least).

    The first delivery to each step is a warm-up, not counted: the first session of a
    process also runs SQLAlchemy's dialect checks (a few statements, once).
    """
    import statistics
    import time

    from . import orm_steps

    def prepare(dsn: str) -> None:
        runtime = Runtime(Settings(database_url=dsn))
        runtime.migrate(orm_steps.app.services)
        runtime.close()

    costs: dict[str, Cost] = collections.defaultdict(Cost)
    times: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    with scratch_database(ADMIN_DSN, prepare) as dsn, tempfile.TemporaryDirectory() as folder:
        runtime = Runtime(Settings(database_url=dsn, pool_size=1))
        tracer = Tracer(runtime, ["ormbench"], Path(folder))
        tracer.start()
        counter = uuid.uuid4()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO ormbench.counters (counter_id) VALUES (%s)", (counter,))
        steps = orm_steps.app.steps
        for actor, kind in orm_steps.COMMANDS.items():
            for n in range(deliveries + 1):
                message = to_message_for(actor, kind(counter, 1))
                if n == 0:
                    deliver(steps[actor], runtime, message)
                    continue
                started, cpu = time.perf_counter(), time.process_time()
                deliver(steps[actor], runtime, message)
                times[actor].append((time.perf_counter() - started, time.process_time() - cpu))
            # Counted on separate deliveries: tracing slows the timed ones down.
            for _ in range(min(deliveries, 20)):
                message = to_message_for(actor, kind(counter, 1))
                _, lines = tracer.read("ormbench", functools.partial(deliver, steps[actor], runtime, message))
                costs[actor].add(read_trace(lines))
        runtime.close()
    medians = {
        actor: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)) for actor, ts in times.items()
    }
    return dict(costs), medians


def run_django(deliveries: int) -> tuple[dict[str, Cost], dict[str, tuple[float, float]]]:
    """Deliver ``deliveries`` messages to the steps of :mod:`bench.django_steps`; return the median times.

    The wall time of a delivery and its CPU time in this process, for: the SQL step on
    estafeta's pool, the same step on Django's connection (``step_connections``), and the
    ORM step on Django's connection. Django keeps its connection (``CONN_MAX_AGE=None``), as
    a worker should; the first delivery of each is a warm-up.
    """
    import statistics
    import time

    import django
    from django.conf import settings as django_settings

    from estafeta import django as es

    from . import django_steps

    def prepare(dsn: str) -> None:
        runtime = Runtime(Settings(database_url=dsn))
        runtime.migrate(django_steps.app.services)
        runtime.close()

    times: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    costs: dict[str, Cost] = collections.defaultdict(Cost)
    with scratch_database(ADMIN_DSN, prepare) as dsn:
        parts = psycopg.conninfo.conninfo_to_dict(dsn)
        django_settings.configure(
            DATABASES={
                "default": {
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": parts.get("dbname"),
                    "HOST": parts.get("host", ""),
                    "PORT": parts.get("port", ""),
                    "USER": parts.get("user", ""),
                    "CONN_MAX_AGE": None,
                }
            },
            INSTALLED_APPS=["estafeta.django", "examples.shelf_django"],
            USE_TZ=True,
        )
        django.setup()
        pooled = Runtime(Settings(database_url=dsn, pool_size=1))
        on_django = Runtime(Settings(database_url=dsn), step_connections=es.step_connections())
        item_id = uuid.uuid4()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO shelf.items (item_id, name) VALUES (%s, 'bench')", (item_id,))
        steps = django_steps.app.steps
        runs = [
            ("SQL, estafeta's pool", "shelf.bench_by_sql", django_steps.BySql, pooled),
            ("SQL, Django's connection", "shelf.bench_by_sql", django_steps.BySql, on_django),
            ("Django ORM, Django's connection", "shelf.bench_by_django", django_steps.ByDjango, on_django),
        ]
        from django.db import connection as django_connection

        for label, actor, kind, runtime in runs:
            for n in range(deliveries + 1):
                message = to_message_for(actor, kind(item_id, 1))
                started, cpu = time.perf_counter(), time.process_time()
                deliver(steps[actor], runtime, message)
                if n:
                    times[label].append((time.perf_counter() - started, time.process_time() - cpu))
            # Counted on separate deliveries, from the libpq trace of the step's connection.
            conn = django_connection.connection if runtime is on_django else None
            for _ in range(min(deliveries, 20)):
                message = to_message_for(actor, kind(item_id, 1))
                with tempfile.TemporaryFile("w+") as out:
                    if conn is None:
                        with pooled.database("shelf").connection() as conn_of_pool:
                            traced = conn_of_pool
                    else:
                        traced = conn
                    traced.pgconn.trace(out.fileno())
                    traced.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
                    try:
                        deliver(steps[actor], runtime, message)
                    finally:
                        traced.pgconn.untrace()
                    out.seek(0)
                    costs[label].add(read_trace(out.read().splitlines()))
        pooled.close()
        on_django.close()
        from django.db import connections

        connections.close_all()
    medians = {
        label: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)) for label, ts in times.items()
    }
    return dict(costs), medians


def report_django(costs: dict[str, Cost], medians: dict[str, tuple[float, float]]) -> str:
    """A line per way of running the step: counts per delivery and the median wall and CPU times."""
    header = f"{'step':34} {'statements':>10} {'round trips':>11} {'commits':>8} {'wall ms':>8} {'cpu ms':>7}"
    lines = [header]
    for label, cost in costs.items():
        n, (wall, cpu) = cost.deliveries, medians[label]
        lines.append(
            f"{label:34} {cost.statements / n:>10.1f} {cost.round_trips / n:>11.1f} {cost.commits / n:>8.1f}"
            f" {wall * 1000:>8.2f} {cpu * 1000:>7.2f}"
        )
    return "\n".join(lines)


def to_message_for(actor: str, command: Any) -> Any:
    """The message the relay would publish for ``command`` to ``actor``."""
    import dramatiq

    from estafeta import to_json

    queue = actor.split(".")[0]
    return dramatiq.Message(queue_name=queue, actor_name=actor, args=(to_json(command),), kwargs={}, options={})


def report_orm(costs: dict[str, Cost], medians: dict[str, tuple[float, float]]) -> str:
    """A table per step of :mod:`bench.orm_steps`: counts per delivery and the median times."""
    header = f"{'actor':28} {'statements':>10} {'round trips':>11} {'commits':>8} {'wall ms':>8} {'cpu ms':>7}"
    lines = [header]
    for actor, cost in costs.items():
        n = cost.deliveries
        wall, cpu = medians[actor]
        lines.append(
            f"{actor:28} {cost.statements / n:>10.1f} {cost.round_trips / n:>11.1f} {cost.commits / n:>8.1f}"
            f" {wall * 1000:>8.2f} {cpu * 1000:>7.2f}"
        )
    return "\n".join(lines)


def report(costs: dict[str, Cost]) -> str:
    """A table: per delivery of each actor, and over the whole saga."""
    lines = [f"{'actor':40} {'deliveries':>10} {'statements':>10} {'round trips':>11} {'commits':>8} {'async':>6}"]
    saga = Cost()
    for actor, cost in sorted(costs.items()):
        n = cost.deliveries
        lines.append(
            f"{actor:40} {n:>10} {cost.statements / n:>10.1f} {cost.round_trips / n:>11.1f}"
            f" {cost.commits / n:>8.1f} {cost.async_commits / n:>6.1f}"
        )
        if not actor.startswith("pingpong"):
            saga.add(cost)
    if saga.deliveries:
        n = saga.deliveries
        lines.append(
            f"{'all order-saga steps (per delivery)':40} {n:>10} {saga.statements / n:>10.1f}"
            f" {saga.round_trips / n:>11.1f} {saga.commits / n:>8.1f} {saga.async_commits / n:>6.1f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=20)
    parser.add_argument("--pings", type=int, default=20)
    parser.add_argument("--orm", type=int, default=0, help="instead: deliveries per step of bench/orm_steps.py")
    parser.add_argument("--django", type=int, default=0, help="instead: deliveries per step of bench/django_steps.py")
    args = parser.parse_args()
    if args.django:
        print(f"run {uuid.uuid4().hex[:6]}: {args.django} deliveries per step, one at a time")
        print(report_django(*run_django(args.django)))
        return
    if args.orm:
        print(f"run {uuid.uuid4().hex[:6]}: {args.orm} deliveries per step, one at a time")
        print(report_orm(*run_orm(args.orm)))
        return
    print(f"run {uuid.uuid4().hex[:6]}: {args.pings} ping/pongs, {args.orders} order sagas, one delivery at a time")
    print(report(run(args.orders, args.pings)))


if __name__ == "__main__":
    main()
