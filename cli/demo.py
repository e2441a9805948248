"""``estafeta demo``: the order system end to end, with a summary an operator would trust.

With no configuration it runs on an embedded PostgreSQL and the StubBroker, with a
Dramatiq worker, the relay and the saga watchdog inside this process. With
``ESTAFETA_BROKER_URL`` set to RabbitMQ or Redis it starts ``dramatiq estafeta_actors`` worker
processes itself and relays from this process (``--external``: use the workers and the
relay already running instead).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import uuid
from typing import TYPE_CHECKING

import attrs
import click
import dramatiq

from . import demo_harness, demo_summary
from .broker_check import check_broker
from .context import order_system
from .demo_guard import refuse_foreign_consumers
from .seed import OrderPlan, plan_orders, seed_services

if TYPE_CHECKING:
    from estafeta import App, Runtime


def _place(runtime: Runtime, plan: OrderPlan) -> list[uuid.UUID]:
    from estafeta_actors.order_saga import place_order

    timeout = runtime.settings.saga_step_timeout
    saga_ids = []
    database = runtime.database("orders")
    for customer, sku, quantity, amount in plan.orders:
        with database.transaction() as conn:
            placed = place_order(
                conn, customer_id=customer, sku=sku, quantity=quantity, amount_cents=amount, step_timeout=timeout
            )
        saga_ids.append(placed.saga_id)
    return saga_ids


def _wait(runtime: Runtime, saga_ids: list[uuid.UUID], timeout: float, quiet: bool) -> int:
    from estafeta_actors.order_saga import ORDER_SAGA
    from estafeta_sql import saga_reports

    deadline = time.monotonic() + timeout
    ended = 0
    with click.progressbar(
        length=len(saga_ids), label="sagas", show_pos=True, file=sys.stderr if quiet else None
    ) as bar:
        while ended < len(saga_ids) and time.monotonic() < deadline:
            time.sleep(0.2)
            with runtime.database("orders").connection() as conn:
                now = saga_reports.count_ended(conn, ORDER_SAGA.table, saga_ids)
            bar.update(now - ended)
            ended = now
    return ended


@click.command("demo")
@click.option(
    "--orders", "count", type=click.IntRange(1, 100_000), default=200, show_default=True, help="Orders to place."
)
@click.option(
    "--duplicate-every",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="Publish every Nth message twice, as a relay killed between publish and delete would (0: never).",
)
@click.option(
    "--processes", type=click.IntRange(1, 64), default=2, show_default=True, help="Worker processes (real brokers)."
)
@click.option("--external", is_flag=True, help="Real brokers: use the workers and relay already running.")
@click.option("--timeout", type=click.FloatRange(min=1), default=600, show_default=True, help="Seconds to wait.")
@click.option("--seed", "rng_seed", type=int, help="Random seed of the order mix (default: a new mix each run).")
@click.option(
    "--database-per-service",
    is_flag=True,
    help="Run every service in a database of its own (<database>_<service> on the same server, created if missing).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def demo_command(
    count: int,
    duplicate_every: int,
    processes: int,
    external: bool,
    timeout: float,
    rng_seed: int | None,
    database_per_service: bool,
    as_json: bool,
) -> None:
    """Place orders and watch their sagas finish: completed, compensated, throughput, latency, reconciliation.

    Accounts and stock are seeded (names unique to this run) so that some orders are
    refused for lack of money or stock and their sagas compensate. Exits 1 if a saga did
    not end, ended failed, or money or stock is not accounted for.
    """
    context = order_system()
    runtime, broker = context.runtime, context.broker
    check_broker(runtime, broker)
    if database_per_service:
        runtime, broker = _database_per_service(context.app, runtime)
    if not external:  # the demo's own workers start below: a consumer there now is another deployment's
        refuse_foreign_consumers(context.app, broker, runtime.settings.redacted_broker_url)
    context.app.migrate(runtime)
    run = uuid.uuid4().hex[:6]
    plan = plan_orders(count, prefix=f"demo-{run}-", rng=random.Random(rng_seed))
    seed_services(runtime, plan.balances, plan.stock)
    with demo_harness.start(runtime, broker, duplicate_every, processes, external) as harness:
        if not as_json:
            click.echo(f"estafeta demo: {count} orders on {_where(runtime)}, run by {harness.description}")
            click.echo(f"seeded {len(plan.balances)} accounts and {len(plan.stock)} SKUs (prefix demo-{run}-)")
        before = demo_harness.duplicates_counted()
        saga_ids = _place(runtime, plan)
        ended = _wait(runtime, saga_ids, timeout, as_json)
        harness.settle()
        absorbed = demo_harness.absorbed(before, harness)
    summary = demo_summary.summary(runtime, plan, saga_ids, harness, absorbed)
    click.echo(json.dumps(summary) if as_json else demo_summary.report(summary))
    if ended < len(saga_ids) or summary["failed"] or summary["gave_up"] or not summary["reconciled"]:
        raise click.exceptions.Exit(1)


def _database_per_service(app: App, runtime: Runtime) -> tuple[Runtime, dramatiq.Broker]:
    """A runtime (and the app bound to a broker of its own) with each service in a database of its own.

    Each service without an ``ESTAFETA_<SERVICE>_DATABASE_URL`` gets ``<database>_<service>``
    on the server of ``ESTAFETA_DATABASE_URL`` (the embedded one too), created if missing.
    The variables are set in this process's environment, so the worker processes the
    demo starts use the same databases.
    """
    from psycopg import conninfo

    from estafeta import Runtime
    from estafeta_sql import embedded, migrate

    settings = runtime.settings
    base = embedded.start() if settings.database_url == "embedded" else settings.database_url
    dbname = conninfo.conninfo_to_dict(base).get("dbname") or "postgres"
    urls = dict(settings.service_database_urls)
    for service in app.service_names:
        if service not in urls:
            urls[service] = conninfo.make_conninfo(base, dbname=f"{dbname}_{service}")
            migrate.create_database(base, f"{dbname}_{service}")
        os.environ[f"ESTAFETA_{service.upper()}_DATABASE_URL"] = urls[service]
    separate = Runtime(attrs.evolve(settings, service_database_urls=urls))
    binding = app.bind(runtime=separate)  # a broker of its own: the steps run with this runtime
    return separate, binding.broker


def _where(runtime: Runtime) -> str:
    from estafeta_sql.pool import describe_dsn

    url = runtime.settings.database_url
    database = "an embedded PostgreSQL (.estafeta/pgdata)" if url == "embedded" else describe_dsn(url)
    if runtime.settings.service_database_urls:
        database += " (each service in a database of its own)"
    broker = runtime.settings.redacted_broker_url
    return f"{database} and {'the StubBroker' if broker.startswith('stub:') else broker}"


COMMANDS = [demo_command]
