"""``python -m examples.welcome``: register customers and watch the choreography run."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator

import click

from estafeta import build_relay, running

from . import binding, flow


@contextlib.contextmanager
def _relaying() -> Iterator[None]:
    # On a real broker the workers run elsewhere (`dramatiq examples.welcome`);
    # this process relays the outboxes (it is not a worker, so that is allowed).
    relay = build_relay(binding.runtime, binding.broker, flow.app.service_names, poll_interval=0.2)
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


@click.command()
@click.option("--customers", type=click.IntRange(1, 10_000), default=3, show_default=True)
@click.option("--timeout", type=click.FloatRange(min=1), default=60, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print each customer's journey as JSON.")
def main(customers: int, timeout: float, as_json: bool) -> None:
    """Register CUSTOMERS customers; each gets a welcome bonus, then a welcome mail."""
    runtime = binding.runtime
    flow.app.migrate(runtime)
    stub = runtime.settings.broker_url.startswith("stub:")
    harness = running(binding) if stub else _relaying()
    with harness:
        registered = []
        with runtime.database("customers").transaction() as conn:
            for i in range(customers):
                registered.append(flow.register_customer(conn, f"customer{i}-{time.time_ns()}@example.com")[0])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with runtime.database("customers").connection() as conn:
                done = [j for j in flow.journeys(conn) if j["customer_id"] in {str(c) for c in registered}]
            if all(j["mail_saga_id"] and j["recorded_points"] for j in done):
                break
            time.sleep(0.1)
    _print(done, as_json)
    if not all(j["mail_saga_id"] for j in done):
        sys.exit(1)


def _print(done: list[dict[str, object]], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(done))
        return
    for j in done:
        mail = "welcome mail sent" if j["mail_saga_id"] else "no mail yet"
        bonus = f"bonus {j['bonus_points']} points"
        click.echo(f"{j['email']}: registered -> {bonus} -> {mail} (saga {j['bonus_saga_id']})")


main()
