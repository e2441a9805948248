"""Kill and recover: orders placed with the CLI; workers and relay SIGKILLed mid-way and restarted.

The order system's "done means" run::

    python -m estafeta_actors.kill_and_recover --database-url postgresql://app@db/shop \\
        --broker-url amqp://guest:guest@127.0.0.1:5672/%2F --orders 1000 --processes 2

It seeds accounts and stock (``estafeta seed``), starts ``dramatiq estafeta_actors --processes P``
and ``estafeta relay``, places the orders (``estafeta orders place --count N``), SIGKILLs
the workers and the relay once a quarter of the sagas have ended and restarts them,
SIGKILLs the workers again once half have ended, while sagas are compensating, and restarts them, then waits
until every saga has ended and checks that every order's money and stock is accounted
for. Names carry a prefix of their own, so the database may hold other data. With
``--service-database payments=postgresql://...`` (repeatable; ``extra_env`` with
``ESTAFETA_<SERVICE>_DATABASE_URL`` from Python) a service runs in a database of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

import attrs
import click
import psycopg

from estafeta import Runtime, Settings

ROOT = Path(__file__).resolve().parents[1]


@attrs.frozen
class Plan:
    """The size and shape of the run."""

    orders: int
    customers: int = 10
    skus: int = 5
    amount: int = 700
    processes: int = 2
    threads: int = 8
    #: Seconds a saga waits for a reply before the watchdog re-sends (ESTAFETA_SAGA_STEP_TIMEOUT).
    step_timeout: float = 20.0
    #: Seconds to wait for every saga to end.
    timeout: float = 900.0
    #: Kill and restart the processes mid-way (``False``: a plain run, the baseline).
    kill: bool = True

    def balance(self) -> int:
        """Each customer can pay for about four orders in five."""
        return self.orders // self.customers * self.amount * 4 // 5

    def stock(self) -> int:
        """Each SKU covers about seven units in ten of its orders."""
        return self.orders // self.skus * 7 // 10


class Child:
    """A child process in its own process group (SIGKILL reaches a worker's children too)."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], log_dir: Path) -> None:
        self.name = name
        self.log = log_dir / f"{name}-{time.monotonic_ns()}.log"
        with self.log.open("wb") as out:
            self.popen = subprocess.Popen(
                argv, cwd=ROOT, env=dict(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)
        if sig == signal.SIGKILL:
            self.popen.wait(30)

    def stop(self) -> None:
        """SIGTERM, SIGKILL after 30 s; then SIGKILL to what is left of the group (a worker that outlived its main)."""
        if self.popen.poll() is None:
            self.kill(signal.SIGTERM)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.kill()


def _at_rest(found: dict[str, int]) -> int:
    """Sagas of ``found`` (counts by status) that nothing moves for now but a late answer or an operator."""
    return sum(found.get(status, 0) for status in ("completed", "compensated", "failed", "gave_up"))


class KillAndRecover:
    """One run against one database and broker."""

    def __init__(
        self,
        database_url: str,
        broker_url: str,
        plan: Plan,
        log_dir: Path,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.database_url = database_url
        self.plan = plan
        self.log_dir = log_dir
        self.prefix = f"k{uuid.uuid4().hex[:6]}-"
        self.bin = Path(sys.executable).parent
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ESTAFETA_")}
        self.env.update(
            ESTAFETA_DATABASE_URL=database_url,
            ESTAFETA_BROKER_URL=broker_url,
            ESTAFETA_MIN_BACKOFF_MS="100",
            ESTAFETA_MAX_BACKOFF_MS="2000",
            ESTAFETA_RELAY_POLL_INTERVAL="0.2",
            ESTAFETA_SAGA_STEP_TIMEOUT=str(plan.step_timeout),
            ESTAFETA_SAGA_WATCH_INTERVAL="0.5",
            PYTHONPATH=str(ROOT),
            **(extra_env or {}),
        )
        # ESTAFETA_<SERVICE>_DATABASE_URL in extra_env: each service in its own database.
        self.settings = Settings.from_env(self.env)
        self.kills: list[dict[str, Any]] = []
        self.workers: Child | None = None
        self.relay: Child | None = None

    def estafeta(self, *args: str) -> str:
        """Run an estafeta command to completion; its output."""
        done = subprocess.run(
            [str(self.bin / "estafeta"), *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=600
        )
        if done.returncode:
            raise RuntimeError(f"estafeta {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def start(self, *, relay: bool = True) -> None:
        """Start the workers (and the relay)."""
        argv = [str(self.bin / "dramatiq"), "estafeta_actors", "--processes", str(self.plan.processes)]
        self.workers = Child("workers", [*argv, "--threads", str(self.plan.threads)], self.env, self.log_dir)
        if relay:
            self.relay = Child("relay", [str(self.bin / "estafeta"), "relay"], self.env, self.log_dir)

    def counts(self) -> dict[str, int]:
        """This run's sagas by status."""
        with psycopg.connect(self.settings.database_url_for("orders"), autocommit=True) as conn:
            rows = conn.execute(
                """SELECT s.status, count(*) FROM orders.saga_order s JOIN orders.orders o USING (order_id)
                   WHERE starts_with(o.customer_id, %s) GROUP BY s.status""",
                (self.prefix,),
            ).fetchall()
        return {str(status): int(count) for status, count in rows}

    def ended(self) -> int:
        """Sagas that stopped moving for now: completed, compensated, failed or gave_up (progress, not the end)."""
        return _at_rest(self.counts())

    def settled(self) -> int:
        """Sagas in a state nothing moves them out of: completed or compensated.

        A saga the watchdog gave up on for want of a reply still moves on when the late answer
        to that command comes (the participant acted), to compensating and on: a run that
        asserts every saga completed or compensated waits for this, not for :meth:`ended`.
        """
        found = self.counts()
        return found.get("completed", 0) + found.get("compensated", 0)

    def wait_for(self, what: str, check: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}: {self.counts()}")
            time.sleep(0.1)

    def _half_and_compensating(self) -> bool:
        found = self.counts()
        ended = _at_rest(found)
        return ended >= self.plan.orders or (ended >= self.plan.orders // 2 and found.get("compensating", 0) > 0)

    def kill(self, reason: str, *, relay: bool) -> None:
        """SIGKILL the workers (and the relay) now, record the moment, and start them again."""
        assert self.workers is not None and self.relay is not None
        self.kills.append({"when": reason, "relay_killed": relay, **self.counts()})
        self.workers.kill()
        if relay:
            self.relay.kill()
        self.start(relay=relay)

    def run(self) -> dict[str, Any]:
        """The whole run; the report."""
        self.prepare()
        started = time.monotonic()
        self.start()
        try:
            self._place_and_survive()
        finally:
            self.stop()
        return self.report(time.monotonic() - started)

    def prepare(self) -> None:
        """Migrate, and seed this run's accounts and stock."""
        plan, prefix = self.plan, self.prefix
        self.estafeta("migrate")
        self.estafeta(
            "seed", "--prefix", prefix, "--customers", str(plan.customers), "--balance", str(plan.balance()),
            "--skus", str(plan.skus), "--stock", str(plan.stock()),
        )  # fmt: skip

    def place(self) -> None:
        """Place the plan's orders (``estafeta orders place --count``)."""
        plan, prefix = self.plan, self.prefix
        place = ["orders", "place", "--quantity", "1", "--amount", str(plan.amount), "--count", str(plan.orders)]
        place += [a for i in range(1, plan.customers + 1) for a in ("--customer", f"{prefix}c{i}")]
        place += [a for i in range(1, plan.skus + 1) for a in ("--sku", f"{prefix}sku{i}")]
        self.estafeta(*place)

    def stop(self) -> None:
        """Stop the workers and the relay (SIGTERM, then SIGKILL)."""
        for child in (self.workers, self.relay):
            if child is not None:
                child.stop()

    def _place_and_survive(self) -> None:
        plan = self.plan
        self.place()
        if plan.kill:
            self._kill_twice()
        self.wait_for("every saga", lambda: self.settled() >= plan.orders, plan.timeout)

    def _kill_twice(self) -> None:
        plan = self.plan
        self.wait_for("a quarter of the sagas", lambda: self.ended() >= plan.orders // 4, plan.timeout)
        self.kill("a quarter of the sagas ended", relay=True)
        # The restarted workers must make progress first: then kill them while sagas compensate.
        self.wait_for("half the sagas, some compensating", self._half_and_compensating, plan.timeout)
        if self.ended() < plan.orders:
            self.kill("half the sagas ended, some compensating", relay=False)

    def report(self, seconds: float) -> dict[str, Any]:
        """Final counts and the reconciliation of money and stock."""
        from .order_saga import reconcile

        plan, prefix = self.plan, self.prefix
        runtime = Runtime(self.settings)
        try:
            with runtime.database("orders").connection() as conn:
                query = "SELECT order_id FROM orders.orders WHERE starts_with(customer_id, %s)"
                order_ids = [r[0] for r in conn.execute(query, (prefix,)).fetchall()]
            balances = {f"{prefix}c{i}": plan.balance() for i in range(1, plan.customers + 1)}
            stock = {f"{prefix}sku{i}": plan.stock() for i in range(1, plan.skus + 1)}
            check = reconcile(runtime, order_ids, balances, stock)
        finally:
            runtime.close()
        return {
            "prefix": prefix,
            "orders": len(order_ids),
            "seconds": round(seconds, 1),
            "kills": self.kills,
            "sagas": dict(check.sagas),
            "money": [check.money_before, check.money_now],
            # From the ledger's events: opened and deposited, and replayed balances + charged payments now.
            "ledger": [check.ledger_deposited, check.ledger_now],
            "ledger_events": check.ledger_events,
            "projection_mismatches": check.projection_mismatches,
            "stock": [check.stock_before, check.stock_now],
            "mismatches": check.mismatches,
            "reconciled": check.ok,
        }


@click.command()
@click.option("--database-url", required=True, help="PostgreSQL DSN (migrated by the run).")
@click.option("--broker-url", required=True, help="amqp://... or redis://...")
@click.option("--orders", type=click.IntRange(min=8), default=1000, show_default=True)
@click.option("--processes", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--step-timeout", type=click.FloatRange(min=0.1), default=20.0, show_default=True)
@click.option("--no-kill", is_flag=True, help="Kill nothing: the baseline run.")
@click.option(
    "--service-database",
    "service_databases",
    multiple=True,
    metavar="SERVICE=DSN",
    help="A database of its own for SERVICE (repeatable).",
)
@click.option("--log-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".estafeta/kill-logs"))
def main(
    database_url: str,
    broker_url: str,
    orders: int,
    processes: int,
    step_timeout: float,
    no_kill: bool,
    service_databases: tuple[str, ...],
    log_dir: Path,
) -> None:
    """Place ORDERS orders, kill workers and relay mid-way, and check that every order is accounted for."""
    import json

    log_dir.mkdir(parents=True, exist_ok=True)
    plan = Plan(orders=orders, processes=processes, step_timeout=step_timeout, kill=not no_kill)
    extra = {}
    for item in service_databases:
        service, separator, dsn = item.partition("=")
        if not separator or not service.isidentifier():
            raise click.BadParameter(f"{item!r} is not SERVICE=DSN", param_hint="--service-database")
        extra[f"ESTAFETA_{service.upper()}_DATABASE_URL"] = dsn
    report = KillAndRecover(database_url, broker_url, plan, log_dir, extra_env=extra).run()
    click.echo(json.dumps(report, indent=2, default=str))
    if not report["reconciled"] or report["sagas"].get("failed") or report["sagas"].get("gave_up"):
        sys.exit(1)


if __name__ == "__main__":
    main()
