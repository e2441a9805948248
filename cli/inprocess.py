"""A worker and a relay inside this process: how the StubBroker runs end to end (demo, ping)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import dramatiq
from dramatiq import Worker

from brokers.relay import Relay

from .relay import build_relay


@contextlib.contextmanager
def running(runtime: Any, broker: dramatiq.Broker, *, worker_threads: int = 8) -> Iterator[Relay]:
    """Run a Dramatiq worker and a relay on ``broker`` until the block ends."""
    relay = build_relay(runtime, broker, [], poll_interval=0.2)
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), name="estafeta-relay", daemon=True)
    worker = Worker(broker, worker_threads=worker_threads, worker_timeout=100)
    worker.start()
    thread.start()
    try:
        yield relay
    finally:
        stop.set()
        thread.join(timeout=10)
        worker.stop()
