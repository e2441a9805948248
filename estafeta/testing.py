"""estafeta's pytest plugin: an app on a fresh StubBroker and real PostgreSQL, and a clock a test moves.

Registered through the ``pytest11`` entry point ``estafeta.testing`` (installing estafeta
is enough; ``-p estafeta.testing`` or ``pytest_plugins = ["estafeta.testing"]`` load it
too, and loading it twice is harmless). Say which app is under test in the pytest
configuration (``estafeta_app = "mypackage.app:app"``) or override the
``estafeta_declared_app`` fixture. Fixtures:

- ``estafeta_app``: the app bound to a fresh StubBroker and a database of the run's own
  (emptied before each test), with a relay and a worker the test drives in its own thread
  (:class:`AppUnderTest`: ``run_until_idle``, ``sent_to``, ``drop``, ``drain_outbox``,
  ``transitions``);
- ``estafeta_runtime``: that app's :class:`~estafeta.Runtime`;
- ``clock``: a :class:`VirtualClock` over the app's schemas, stopped (it reads one instant
  until the test moves it): ``clock.advance(timedelta)`` and ``clock.set(datetime)`` move
  saga deadlines, delayed sends, backoffs and schedules' ticks due, then run the watchdog,
  scheduler and relay passes the move made due, synchronously.

A 30-second saga timeout is then tested in milliseconds, without ``sleep``.
"""

from __future__ import annotations

import os
import queue
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from datetime import datetime, timedelta
from typing import Any

import attrs
import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from estafeta.app.app import App, load_app
from estafeta.app.clock import Clock
from estafeta.app.runtime import Runtime
from estafeta.app.settings import Settings
from estafeta.messaging import handoff as handoff
from estafeta.messaging.relaying import build_relay
from estafeta.sagas.saga import Saga
from estafeta.sagas.watchdog import Watchdog
from estafeta.schedules.scheduler import Scheduler
from estafeta.steps.delivery import deliver
from estafeta_brokers.relay import Relay
from estafeta_sql import sagas as saga_store
from estafeta_sql.scratch import scratch_database, wipe

__all__ = ["TEST_SETTINGS", "AppUnderTest", "Passes", "VirtualClock"]

#: Settings for tests: few retries, tiny backoffs, a short lock wait.
TEST_SETTINGS: dict[str, Any] = {"max_retries": 3, "min_backoff_ms": 10, "max_backoff_ms": 50, "lock_timeout_ms": 2000}


@attrs.frozen
class Passes:
    """What the passes a clock move made due did."""

    #: The watchdog's counts: sagas ``resent``, ``compensating``, ``failed`` (empty: none overdue).
    watchdog: Counter[str]
    #: Outbox rows the relay published.
    published: int
    #: The schedules' counts: ticks ``fired``, ``skipped`` (overlap), ``missed`` (catch-up), ``error``.
    schedules: Counter[str] = attrs.field(factory=Counter)


class VirtualClock:
    """The app's clock, moved by the test; each move runs the watchdog and relay passes it made due."""

    def __init__(
        self,
        clock: Clock,
        *,
        watchdog: Watchdog | None = None,
        relay: Relay | None = None,
        scheduler: Scheduler | None = None,
    ) -> None:
        self.clock = clock
        self.watchdog = watchdog
        self.relay = relay
        self.scheduler = scheduler

    def now(self) -> datetime:
        """The time every decision of the app's services reads."""
        return self.clock.now()

    def advance(self, by: timedelta) -> Passes:
        """Move the time forward by ``by``, then run the passes that became due.

        The schedules' ticks between the old time and the new one fall due (and are fired
        by their catch-up policy).
        """
        if self.scheduler is not None and not self.scheduler.registered:
            self.scheduler.register()
        self.clock.advance(by)
        return self.run_due()

    def set(self, when: datetime) -> Passes:
        """Put the time at ``when`` (timezone-aware), then run the passes that became due.

        A jump: every schedule starts again from its first tick after ``when``.
        """
        self.clock.set(when)
        if self.scheduler is not None:
            self.scheduler.register(restart=True)
        return self.run_due()

    def run_due(self) -> Passes:
        """One watchdog pass over overdue sagas, the schedules' due ticks, then the relay until nothing is due."""
        counts = self.watchdog.check_once() if self.watchdog is not None else Counter[str]()
        fired = Counter[str]()
        if self.scheduler is not None:
            # A catch-up of many ticks fires in batches: pass until a pass finds nothing due.
            while found := self.scheduler.fire_due():
                fired.update(found)
                if found["error"]:
                    break  # a schedule that raises stays due: the test reads its row
        published = drain(self.relay) if self.relay is not None else 0
        return Passes(counts, published, fired)


def drain(relay: Relay) -> int:
    """Publish every due outbox row; return how many."""
    total = 0
    while published := relay.drain_once():
        total += published
    return total


class AppUnderTest:
    """An app bound to a StubBroker, whose relay and worker run when the test says, in its thread."""

    def __init__(self, app: App, runtime: Runtime, broker: StubBroker | None = None) -> None:
        self.app = app
        self.runtime = runtime
        self.broker = broker or StubBroker()
        self.binding = app.bind(self.broker, runtime)
        self.relay = build_relay(runtime, self.broker, app.service_names, attempt_backoff=timedelta(seconds=1))
        #: Fires the app's schedules when the clock moves (``scheduler.trigger``, ``set_paused`` too).
        self.scheduler = Scheduler(runtime, app.schedules)
        self.clock = VirtualClock(
            Clock(runtime, app.service_names),
            watchdog=Watchdog(runtime, app.sagas),
            relay=self.relay,
            scheduler=self.scheduler,
        )

    def drain_outbox(self) -> int:
        """Publish every due outbox row to the StubBroker; return how many."""
        return drain(self.relay)

    def sent_to(self, queue_name: str) -> list[dramatiq.Message[Any]]:
        """The messages waiting on ``queue_name``, oldest first, after the outboxes were drained."""
        self.drain_outbox()
        waiting = self.broker.queues.get(queue_name)
        return [] if waiting is None else [dramatiq.Message.decode(data) for data in list(waiting.queue)]

    def drop(self, actor_name: str) -> list[dramatiq.Message[Any]]:
        """Take the messages for ``actor_name`` off their queues unprocessed (lost on the way); return them."""
        self.drain_outbox()
        dropped, _ = self._take(lambda message: message.actor_name == actor_name)
        return dropped

    def run_until_idle(self, *, hold: Collection[str] = (), limit: int = 1000) -> list[tuple[str, str]]:
        """Relay and deliver until nothing is left but messages for the ``hold`` actors; return (actor, outcome).

        Each message goes through its step as a worker would (transaction, inbox, outbox);
        an error other than a business failure is raised here, not retried.
        """
        done: list[tuple[str, str]] = []
        while True:
            self.drain_outbox()
            ready, _ = self._take(lambda message: message.actor_name not in hold)
            if not ready:
                return done
            for message in ready:
                outcome = deliver(self.app.steps[message.actor_name], self.runtime, message)
                done.append((message.actor_name, outcome.value))
                # Under ESTAFETA_HANDOFFS a step may have leased its row for a hand-off: each
                # message goes the broker's way here, one at a time, so it is released.
                baton = handoff.take()
                if baton is not None:
                    handoff.release(baton)
            if len(done) > limit:
                raise AssertionError(f"still delivering after {limit} messages: {done[-10:]}")

    def transitions(self, saga: Saga | str, saga_id: uuid.UUID) -> list[tuple[str, str, str]]:
        """The saga's logged transitions, oldest first, as (event, status, step)."""
        found = saga if isinstance(saga, Saga) else self.app.saga(saga)
        with self.runtime.database(found.service).connection() as conn:
            return [(e.event, e.status, e.step) for e in saga_store.timeline(conn, found.table, saga_id)]

    def _take(
        self, wanted: Callable[[dramatiq.Message[Any]], bool]
    ) -> tuple[list[dramatiq.Message[Any]], list[dramatiq.Message[Any]]]:
        """Take the ``wanted`` messages off every queue, oldest first; the others stay, in order."""
        taken: list[dramatiq.Message[Any]] = []
        kept: list[dramatiq.Message[Any]] = []
        for waiting in self.broker.queues.values():
            left: list[dramatiq.Message[Any]] = []
            while True:
                try:
                    data = waiting.get_nowait()
                except queue.Empty:
                    break
                message = dramatiq.Message.decode(data)
                (taken if wanted(message) else left).append(message)
            for message in left:
                waiting.put(message.encode())
            kept += left
        return taken, kept

    def close(self) -> None:
        """Close the relay's pools and the broker."""
        for database in {id(o.database): o.database for o in self.relay.outboxes}.values():
            database.close()
        self.broker.flush_all()
        self.broker.close()


# -- the plugin's fixtures ------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("estafeta_app", "the app under test, as package.module or package.module:attribute", default="")


@pytest.fixture(scope="session")
def estafeta_declared_app(pytestconfig: pytest.Config) -> App:
    """The app under test: the ``estafeta_app`` ini option's, unless a conftest overrides this fixture."""
    spec = str(pytestconfig.getini("estafeta_app"))
    if not spec:
        raise pytest.UsageError(
            "estafeta.testing: set estafeta_app = package.module:app in the pytest configuration,"
            " or define an estafeta_declared_app fixture returning the App"
        )
    try:
        return load_app(spec)
    except LookupError as exc:
        raise pytest.UsageError(f"estafeta.testing: estafeta_app = {spec!r}: {exc}") from None


@pytest.fixture(scope="session")
def estafeta_database_url(estafeta_declared_app: App) -> Iterator[str]:
    """A database of the run's own, the app's migrations applied, dropped at the end.

    Created on the server of ``ESTAFETA_TEST_DATABASE_URL`` (default: libpq's environment,
    ``PGHOST``, ``PGUSER``...).
    """
    with scratch_database(os.environ.get("ESTAFETA_TEST_DATABASE_URL", "")) as dsn:
        runtime = Runtime(Settings(database_url=dsn))
        try:
            estafeta_declared_app.migrate(runtime)
        finally:
            runtime.close()
        yield dsn


@pytest.fixture
def estafeta_runtime(estafeta_database_url: str, estafeta_declared_app: App) -> Iterator[Runtime]:
    """A runtime on the run's database, every table of the app's schemas emptied first."""
    wipe(estafeta_database_url, estafeta_declared_app.service_names)
    runtime = Runtime(Settings(database_url=estafeta_database_url, **TEST_SETTINGS))
    yield runtime
    runtime.close()


@pytest.fixture
def estafeta_app(estafeta_declared_app: App, estafeta_runtime: Runtime) -> Iterator[AppUnderTest]:
    """The app bound to a fresh StubBroker and the runtime, driven from the test's thread."""
    bound = AppUnderTest(estafeta_declared_app, estafeta_runtime)
    yield bound
    bound.close()


@pytest.fixture
def clock(estafeta_app: AppUnderTest) -> VirtualClock:
    """The app's clock, stopped: it reads one instant until ``advance`` or ``set`` moves it.

    Each move runs the passes that fell due. Stopped, "one second later" is exactly one
    second later, however long the test's own statements took.
    """
    estafeta_app.clock.clock.stop()
    return estafeta_app.clock
