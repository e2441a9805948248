"""``estafeta demo``: the order system end to end, with a summary an operator would trust.

With no configuration it runs on an embedded PostgreSQL and the StubBroker, with a
Dramatiq worker, the relay and the saga watchdog inside this process. With
``ESTAFETA_BROKER_URL`` set to RabbitMQ or Redis it starts ``dramatiq actors`` worker
processes itself and relays from this process (``--external``: use the workers and the
relay already running instead).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import click
import dramatiq
from dramatiq.brokers.stub import StubBroker

from brokers.publish import Publisher, PublishOutcome
from estafeta import build_relay
from sql.outbox import OutboxRow

from .broker_check import check_broker
from .context import order_system
from .seed import OrderPlan, plan_orders, seed_services

if TYPE_CHECKING:
    from actors.order_saga import Reconciliation
    from estafeta import App, Runtime

#: Where the demo's worker processes write their logs.
LOG_DIR = Path(".estafeta") / "demo-logs"


class DuplicatingPublisher:
    """Publishes every ``every``-th confirmed row a second time.

    That is what a relay does when it dies between the broker's confirm and the delete:
    the demo does it on purpose to show the inboxes absorbing the copies.
    """

    def __init__(self, inner: Publisher, every: int) -> None:
        self.inner = inner
        self.every = every
        self.copies = 0
        self._seen = 0

    def publish(self, rows: Sequence[OutboxRow]) -> PublishOutcome:
        outcome = self.inner.publish(rows)
        if self.every:
            confirmed = set(outcome.confirmed)
            for row in rows:
                if row.id in confirmed:
                    self._seen += 1
                    if self._seen % self.every == 0 and self.inner.publish([row]).confirmed:
                        self.copies += 1
        return outcome

    def close(self) -> None:
        self.inner.close()


@attrs.define
class Harness:
    """What runs the sagas while the demo waits."""

    #: One line saying where the sagas run.
    description: str
    #: The relay's publisher when this process relays (it counts the copies).
    publisher: DuplicatingPublisher | None = None
    #: Worker log files to count absorbed duplicates in (workers in other processes).
    worker_logs: list[Path] = attrs.field(factory=list)
    #: The broker whose queues to wait on before counting (in-process workers only).
    broker: StubBroker | None = None

    def settle(self) -> None:
        """Wait for the last duplicate copies to reach the inboxes (they arrive after their sagas ended)."""
        if self.broker is None:
            time.sleep(1.0)
            return
        for queue in self.broker.get_declared_queues():
            with contextlib.suppress(dramatiq.errors.QueueJoinTimeout):
                self.broker.join(queue, timeout=10_000, fail_fast=False)


@contextlib.contextmanager
def _relaying(runtime: Runtime, broker: dramatiq.Broker, every: int) -> Iterator[DuplicatingPublisher]:
    from actors import app

    relay = build_relay(runtime, broker, app.service_names, poll_interval=0.2)
    publisher = DuplicatingPublisher(relay.publisher, every)
    relay.publisher = publisher
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), name="estafeta-relay", daemon=True)
    thread.start()
    try:
        yield publisher
    finally:
        stop.set()
        thread.join(timeout=10)


@contextlib.contextmanager
def _stub_harness(runtime: Runtime, broker: StubBroker, every: int) -> Iterator[Harness]:
    # The worker boots the saga watchdog too (binding the app added it to the broker's middleware).
    worker = dramatiq.Worker(broker, worker_threads=8, worker_timeout=100)
    worker.start()
    try:
        with _relaying(runtime, broker, every) as publisher:
            yield Harness("a worker, the relay and the saga watchdog in this process", publisher, broker=broker)
    finally:
        worker.stop()


@contextlib.contextmanager
def _process_harness(runtime: Runtime, broker: dramatiq.Broker, every: int, processes: int) -> Iterator[Harness]:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"workers-{time.strftime('%Y%m%d-%H%M%S')}.log"
    argv = [*_dying_with(os.getpid()), "-m", "dramatiq", "actors", "--processes", str(processes), "--threads", "8"]
    with log.open("wb") as out:
        workers = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        with _relaying(runtime, broker, every) as publisher:
            text = f"{processes} `dramatiq actors` process(es) (log: {log}) and the relay in this process"
            yield Harness(text, publisher, [log])
    finally:
        workers.terminate()
        try:
            workers.wait(30)
        except subprocess.TimeoutExpired:
            workers.kill()


# Linux's parent-death signal, set in a small interpreter that then becomes the workers
# (``execv`` keeps it), not in ``preexec_fn``, which is unsafe once this process has threads.
_DIE_WITH_PARENT = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit("estafeta demo: exited before its workers started")
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


def _dying_with(parent: int) -> list[str]:
    """The start of a command line running the rest (``python`` arguments) in a process SIGTERMed when ``parent`` dies.

    The workers run in a session of their own (a Ctrl-C in the terminal is the demo's to
    handle), so nothing else would stop them if the demo were killed (SIGKILL, a test's
    timeout): they would go on taking messages from the run's queues. Elsewhere than
    Linux, the command as it is.
    """
    if sys.platform != "linux":
        return [sys.executable]
    return [sys.executable, "-c", _DIE_WITH_PARENT, str(parent)]


def _harness(runtime: Runtime, broker: dramatiq.Broker, every: int, processes: int, external: bool) -> Any:
    if isinstance(broker, StubBroker):
        return _stub_harness(runtime, broker, every)
    if external:
        return contextlib.nullcontext(Harness("the `dramatiq actors` workers and `estafeta relay` already running"))
    return _process_harness(runtime, broker, every, processes)


def _place(runtime: Runtime, plan: OrderPlan) -> list[uuid.UUID]:
    from actors.order_saga import place_order

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
    from actors.order_saga import ORDER_SAGA
    from sql import sagas

    deadline = time.monotonic() + timeout
    ended = 0
    with click.progressbar(
        length=len(saga_ids), label="sagas", show_pos=True, file=sys.stderr if quiet else None
    ) as bar:
        while ended < len(saga_ids) and time.monotonic() < deadline:
            time.sleep(0.2)
            with runtime.database("orders").connection() as conn:
                now = sagas.count_ended(conn, ORDER_SAGA.table, saga_ids)
            bar.update(now - ended)
            ended = now
    return ended


def _absorbed(before: float, harness: Harness) -> int | None:
    if harness.worker_logs:
        return sum(p.read_text(errors="replace").count("duplicate delivery of") for p in harness.worker_logs)
    if harness.publisher is None:
        return None
    return int(_duplicates_counted() - before)


def _duplicates_counted() -> float:
    from estafeta.observability.metrics import STEPS

    return sum(
        sample.value
        for metric in STEPS.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels.get("outcome") == "duplicate"
    )


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
    context.app.migrate(runtime)
    run = uuid.uuid4().hex[:6]
    plan = plan_orders(count, prefix=f"demo-{run}-", rng=random.Random(rng_seed))
    seed_services(runtime, plan.balances, plan.stock)
    with _harness(runtime, broker, duplicate_every, processes, external) as harness:
        if not as_json:
            click.echo(f"estafeta demo: {count} orders on {_where(runtime)}, run by {harness.description}")
            click.echo(f"seeded {len(plan.balances)} accounts and {len(plan.stock)} SKUs (prefix demo-{run}-)")
        before = _duplicates_counted()
        saga_ids = _place(runtime, plan)
        ended = _wait(runtime, saga_ids, timeout, as_json)
        harness.settle()
        absorbed = _absorbed(before, harness)
    summary = _summary(runtime, plan, saga_ids, harness, absorbed)
    click.echo(json.dumps(summary) if as_json else _report(summary))
    if ended < len(saga_ids) or summary["failed"] or not summary["reconciled"]:
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
    from sql import embedded, migrate

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
    from sql.pool import describe_dsn

    url = runtime.settings.database_url
    database = "an embedded PostgreSQL (.estafeta/pgdata)" if url == "embedded" else describe_dsn(url)
    if runtime.settings.service_database_urls:
        database += " (each service in a database of its own)"
    broker = runtime.settings.redacted_broker_url
    return f"{database} and {'the StubBroker' if broker.startswith('stub:') else broker}"


def _summary(
    runtime: Runtime, plan: OrderPlan, saga_ids: list[uuid.UUID], harness: Harness, absorbed: int | None
) -> dict[str, Any]:
    from actors.order_saga import ORDER_SAGA, reconcile
    from sql import sagas

    with runtime.database("orders").connection() as conn:
        outcomes = sagas.outcomes(conn, ORDER_SAGA.table, saga_ids)
        latency = sagas.latency(conn, ORDER_SAGA.table, saga_ids)
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


def _report(s: dict[str, Any]) -> str:
    r = s["reconciliation"]
    ok = {True: "OK", False: "MISMATCH"}
    lines = [
        f"completed     {s['completed']:>6}",
        f"compensated   {s['compensated']:>6}   "
        + ", ".join(f"{k}: {v}" for k, v in s["compensation_reasons"].items()),
        f"failed        {s['failed']:>6}" + ("   (see `estafeta sagas list --status failed`)" if s["failed"] else ""),
    ]
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


COMMANDS = [demo_command]
