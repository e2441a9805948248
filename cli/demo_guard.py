"""What ``estafeta demo`` checks before it starts: that no other deployment consumes its queues.

The demo starts its own workers. A consumer already on its queues is someone else's (another
deployment's workers on the same vhost or Redis namespace): it would take a share of the
demo's messages, and park them as another deployment's (``estafeta.steps.foreign``), so the
demo's sagas would stall. The demo refuses to start instead, in one line.
"""

from __future__ import annotations

import sys
from typing import NoReturn

import dramatiq

from estafeta import App
from estafeta_brokers.queue_consumers import queue_consumers


def refuse_foreign_consumers(app: App, broker: dramatiq.Broker, where: str) -> None:
    """Exit 2 with one line if a queue of ``app`` on ``broker`` (``where``, password masked) has consumers already.

    A broker that cannot tell (the StubBroker, Kafka) passes; one that cannot be reached is
    one line and exit 2 too: the demo could not run on it.
    """
    for name in sorted({spec.queue_name for spec in app.steps.values()}):
        try:
            found = queue_consumers(broker, name)
        except Exception as exc:
            _refuse(f"cannot ask {where} about its queues' consumers: {type(exc).__name__}: {exc}")
        if found.count:
            _refuse(
                f"queue {name} on {where} already has consumers ({found.describe()}) that are not this demo's:"
                " they would take a share of its messages; stop them, give the demo a RabbitMQ vhost or Redis"
                " namespace of its own, or pass --external to run on them"
            )


def _refuse(line: str) -> NoReturn:
    print(f"estafeta demo: {line}", file=sys.stderr)
    raise SystemExit(2)
