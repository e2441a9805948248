"""What runs the demo's sagas while it waits, and the duplicates it publishes on purpose.

In this process (a Dramatiq worker, the relay and the saga watchdog, on the StubBroker) or
in ``dramatiq estafeta_actors`` processes the demo starts and ties to its own life (on RabbitMQ or
Redis), or the workers and relay already running. Apart from the command (:mod:`estafeta_cli.demo`):
this is the machinery under the demo's story, with the relay's publisher that publishes
every Nth row twice and the count of copies the inboxes absorbed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import dramatiq
from dramatiq.brokers.stub import StubBroker

from estafeta import build_relay
from estafeta_brokers.publish import Publisher, PublishOutcome
from estafeta_sql.outbox import OutboxRow

if TYPE_CHECKING:
    from estafeta import Runtime

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
    from estafeta_actors import app

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
    argv = [
        *_dying_with(os.getpid()),
        "-m",
        "dramatiq",
        "estafeta_actors",
        "--processes",
        str(processes),
        "--threads",
        "8",
    ]
    with log.open("wb") as out:
        workers = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        with _relaying(runtime, broker, every) as publisher:
            text = f"{processes} `dramatiq estafeta_actors` process(es) (log: {log}) and the relay in this process"
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


def start(runtime: Runtime, broker: dramatiq.Broker, every: int, processes: int, external: bool) -> Any:
    """A context manager running the sagas on ``broker`` (publishing every ``every``-th row twice) until it exits."""
    if isinstance(broker, StubBroker):
        return _stub_harness(runtime, broker, every)
    if external:
        return contextlib.nullcontext(
            Harness("the `dramatiq estafeta_actors` workers and `estafeta relay` already running")
        )
    return _process_harness(runtime, broker, every, processes)


def absorbed(before: float, harness: Harness) -> int | None:
    """The copies the inboxes absorbed: from the workers' logs, or counted here since ``before``; else ``None``."""
    if harness.worker_logs:
        return sum(p.read_text(errors="replace").count("duplicate delivery of") for p in harness.worker_logs)
    if harness.publisher is None:
        return None
    return int(duplicates_counted() - before)


def duplicates_counted() -> float:
    """The duplicate deliveries this process's steps have absorbed so far (the steps' metric)."""
    from estafeta.observability.metrics import STEPS

    return sum(
        sample.value
        for metric in STEPS.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels.get("outcome") == "duplicate"
    )
