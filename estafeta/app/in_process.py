"""A worker and a relay inside this process: how an app runs end to end on the StubBroker.

The StubBroker lives in one process, so its messages are consumed by a Dramatiq worker
in that same process; :func:`running` adds the relay (and, through the binding's
middleware, the saga watchdog). The order system's demo and ``estafeta ping`` use it,
and so can an app's own tests.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from dramatiq import Worker

from estafeta.messaging.relaying import build_relay
from estafeta_brokers.relay import Relay

if TYPE_CHECKING:
    from estafeta.app.app import Binding


@contextlib.contextmanager
def running(binding: Binding, *, worker_threads: int = 8, poll_interval: float = 0.2) -> Iterator[Relay]:
    """Run a Dramatiq worker and a relay for ``binding`` in this process until the block ends.

    Yields the relay. Every outbox row the app's steps write is published to the binding's
    broker and processed by the worker; the block's end stops both (the relay finishes
    its batch in hand).
    """
    relay = build_relay(binding.runtime, binding.broker, binding.app.service_names, poll_interval=poll_interval)
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), name="estafeta-relay", daemon=True)
    worker = Worker(binding.broker, worker_threads=worker_threads, worker_timeout=100)
    worker.start()
    thread.start()
    try:
        yield relay
    finally:
        stop.set()
        thread.join(timeout=10)
        worker.stop()
        # relay.run closed its publisher; its pools are the relay's own.
        for database in {id(o.database): o.database for o in relay.outboxes}.values():
            database.close()
