"""``python -m bench.step_cpu``: CPU of one step delivery, client and server, in this process (no broker).

``estafeta.deliver`` runs the ping step (or the order saga's charge step) ``--deliveries``
times on one thread, as a worker thread does; the figures are the CPU time of this process
and of its PostgreSQL backends (``/proc``) per delivery, so a busy machine changes them
little. Each round runs the deliveries twice, alternated: as the StubBroker, Redis and
Kafka hand them over (every delivery counted in its own transaction first) and as RabbitMQ
hands over a first delivery (its ``redelivered`` flag clear: not counted).
``--profile`` prints cProfile's top functions by own CPU time instead (first deliveries).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import dramatiq
import psycopg
from dramatiq.brokers.rabbitmq import _RabbitmqMessage

from estafeta import Runtime, Settings, deliver
from estafeta.messaging.messages import to_json
from estafeta_actors.app import app
from estafeta_actors.pingpong import Ping

from .common import admin_dsn, scratch_database
from .cpu import process_cpu


def _message() -> dramatiq.Message[Any]:
    ping = Ping(uuid.uuid4(), datetime.now(UTC))
    return dramatiq.Message(
        queue_name="pingpong", actor_name="pingpong.ping", args=(to_json(ping),), kwargs={}, options={}
    )


def _first_delivery(message: dramatiq.Message[Any]) -> Any:
    """``message`` as Dramatiq's RabbitMQ consumer hands over a first delivery (its own class)."""
    return _RabbitmqMessage(False, 0, message)


#: How each variant's messages are handed to the step.
VARIANTS: dict[str, Callable[[dramatiq.Message[Any]], Any]] = {
    "counted": lambda message: message,
    "first delivery (RabbitMQ)": _first_delivery,
}


def measure(deliveries: int, profile: bool, rounds: int) -> None:
    def prepare(dsn: str) -> None:
        runtime = Runtime(Settings(database_url=dsn))
        runtime.migrate(app.services)
        runtime.close()

    with scratch_database(admin_dsn(), prepare) as dsn, psycopg.connect(dsn, autocommit=True) as probe:
        runtime = Runtime(Settings(database_url=dsn, pool_size=1))
        spec = app.steps["pingpong.ping"]
        for _ in range(20):  # connected, statements prepared
            deliver(spec, runtime, _message())
        messages = [_message() for _ in range(deliveries * rounds * len(VARIANTS))]
        backends = [
            int(r[0])
            for r in probe.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        ]
        if profile:
            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
            for message in messages[:deliveries]:
                deliver(spec, runtime, _first_delivery(message))
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
            runtime.close()
            return
        batches = iter(messages[n : n + deliveries] for n in range(0, len(messages), deliveries))
        for _ in range(rounds):
            for variant, hand_over in VARIANTS.items():
                batch = next(batches)
                client, server = process_cpu(os.getpid()), sum(process_cpu(p) for p in backends)
                began = time.perf_counter()
                for message in batch:
                    deliver(spec, runtime, hand_over(message))
                wall = time.perf_counter() - began
                client = (process_cpu(os.getpid()) - client) * 1e6 / deliveries
                server = (sum(process_cpu(p) for p in backends) - server) * 1e6 / deliveries
                print(
                    f"ping step, {variant}: client {client:.0f} us CPU, server {server:.0f} us CPU,"
                    f" {client + server:.0f} in all, {wall * 1e6 / deliveries:.0f} us wall per delivery;"
                    f" load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
        runtime.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.step_cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    measure(args.deliveries, args.profile, args.rounds)


if __name__ == "__main__":
    main()
