"""Dramatiq middleware an app's binding adds: refusals and notices a worker owes its operator."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import dramatiq

from estafeta.app.clock import warn_if_moved
from estafeta.observability import logs as logs
from estafeta_sql.embedded import DEFAULT_DATA_DIR
from estafeta_sql.errors import DatabaseRefused, DatabaseUnavailable

if TYPE_CHECKING:
    from estafeta.app.runtime import Runtime

#: What a worker on the StubBroker says before it stops.
STUB_REFUSAL = (
    "estafeta: ESTAFETA_BROKER_URL is stub:// (the default), and the StubBroker only runs inside one"
    " process (estafeta demo, tests): set ESTAFETA_BROKER_URL to amqp://... or redis://... for"
    " `dramatiq` workers"
)


def embedded_notice(what: str, data_dir: Path = DEFAULT_DATA_DIR) -> str:
    """The line a process on the embedded PostgreSQL prints at start."""
    return (
        f"estafeta: this {what} uses the embedded PostgreSQL (ESTAFETA_DATABASE_URL=embedded),"
        f" its data in {data_dir.resolve()}: for trying estafeta out, not for production"
    )


class RefuseStubBroker(dramatiq.Middleware):
    """Stops a ``dramatiq`` worker process whose broker is the StubBroker of ``stub://``.

    Such a worker would wait forever: nothing outside its own process can reach its
    queues. ``process_boot`` is emitted only by the ``dramatiq`` command's worker
    processes, so in-process workers (the demo, tests) are not affected.
    """

    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        print(STUB_REFUSAL, file=sys.stderr, flush=True)
        # SystemExit passes through Dramatiq's middleware dispatch (it only catches
        # Exception): the worker process exits 2 and the dramatiq command with it.
        raise SystemExit(2)


class RefuseRefusedDatabase(dramatiq.Middleware):
    """Stops a ``dramatiq`` worker process at boot when a server refuses one of its databases.

    A database that does not exist, or a role or password the server refuses, is a setting
    to fix, not an outage to wait out: the worker prints one line naming the variable, the
    server, the database and what to do, and exits 2 before it reports ready. A server
    that is down (or silent for longer than ``wait`` seconds) holds nothing back: the
    worker starts and its pools retry, as after any outage.
    """

    def __init__(self, runtime: Runtime, services: Sequence[str], wait: float = 30.0) -> None:
        self.runtime = runtime
        self.services = list(services)
        self.wait = wait

    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        refused: list[str] = []
        checker = threading.Thread(target=self._check, args=(refused,), name="estafeta-database-check", daemon=True)
        checker.start()
        checker.join(self.wait)
        if refused:
            print(f"estafeta: {refused[0]}", file=sys.stderr, flush=True)
            raise SystemExit(2)  # passes through Dramatiq's middleware dispatch, as RefuseStubBroker's

    def _check(self, refused: list[str]) -> None:
        checked = set()
        for service in self.services:
            if self.runtime.settings.database_url_for(service) == "embedded":
                continue  # started by this process: nothing to refuse it
            database = self.runtime.database(service)
            if database.dsn in checked:
                continue
            checked.add(database.dsn)
            try:
                database.check_connect()
            except DatabaseRefused as exc:
                refused.append(str(exc))
                return
            except DatabaseUnavailable:
                return  # an outage: the pools wait for the server

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.services!r})"


class EmbeddedDatabaseNotice(dramatiq.Middleware):
    """Prints, once per ``dramatiq`` worker process, that it runs on the embedded PostgreSQL."""

    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        print(embedded_notice("worker"), file=sys.stderr, flush=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class MovedClockWarning(dramatiq.Middleware):
    """Warns, once per ``dramatiq`` worker process, of each service whose clock a test moved.

    The look runs in a thread of its own, so a database that is down does not hold the
    worker's boot back (:func:`~estafeta.app.clock.warn_if_moved`).
    """

    def __init__(self, runtime: Runtime, services: Sequence[str]) -> None:
        self.runtime = runtime
        self.services = list(services)

    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        threading.Thread(
            target=warn_if_moved, args=(self.runtime, self.services, "worker"), name="estafeta-clock-check", daemon=True
        ).start()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.services!r})"


class WorkerLogs(dramatiq.Middleware):
    """Makes a ``dramatiq`` worker process's log lines name the message they were written for.

    At boot (after Dramatiq set up its handlers), every root handler gets the filter that
    adds the actor, message id, saga id and trace id, and the format of
    ``ESTAFETA_LOG_FORMAT`` (``text`` keeps Dramatiq's line and appends them; ``json``).
    """

    def __init__(self, log_format: str = "text") -> None:
        self.log_format = log_format

    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        logs.adopt_handlers(self.log_format)
        # Dramatiq and estafeta report a lost or refused broker connection; pika's lines repeat it.
        logs.quiet_pika(logging.getLogger().getEffectiveLevel())


#: A middleware class.
M = TypeVar("M", bound=dramatiq.Middleware)


def has_middleware(broker: dramatiq.Broker, kind: type[Any]) -> bool:
    """Whether ``broker`` already carries a middleware of type ``kind``."""
    return find_middleware(broker, kind) is not None


def find_middleware(broker: dramatiq.Broker, kind: type[M]) -> M | None:
    """``broker``'s middleware of type ``kind``, if it carries one."""
    return next((m for m in broker.middleware if isinstance(m, kind)), None)


class WorkerThread(dramatiq.Middleware):
    """A thread of each worker process, from boot to shutdown: ``run(stop)`` until ``stop`` is set.

    The saga watchdog, the scheduler and the pruner each run as one.
    """

    #: The thread's name, as thread dumps and py-spy show it.
    thread_name = "estafeta-worker-thread"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self, stop: threading.Event) -> None:
        """The thread's work; returns soon after ``stop`` is set."""
        raise NotImplementedError

    def after_worker_boot(self, broker: dramatiq.Broker, worker: Any) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, args=(self._stop,), name=self.thread_name, daemon=True)
        self._thread.start()

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
