"""Fixtures: a scratch PostgreSQL database per run, wiped between tests; fresh StubBrokers."""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator
from datetime import timedelta
from typing import Any

import dramatiq
import psycopg
import pytest
from dramatiq.brokers.stub import StubBroker

from estafeta import App, Runtime, Service, Settings
from estafeta.testing import TEST_SETTINGS
from estafeta_brokers.outboxes import Outbox
from estafeta_brokers.publish import EnqueuePublisher
from estafeta_brokers.relay import Relay, RelayConfig
from estafeta_sql.scratch import wipe
from examples.booking import app as booking_app
from examples.loyalty.service import app as loyalty_app
from examples.shelf import app as shelf_app
from examples.welcome.flow import app as welcome_app

from .app import app as tests_app
from .kafka_server import kafka_base_url, kafka_url, tansu_node  # noqa: F401  (Kafka fixtures, on Tansu)
from .services import drop_redis_namespace, rabbitmq_vhost, redis_namespaced, scratch_database
from .ticker import app as ticker_app

#: Every app the tests run: the order system with the probe service, and the examples.
APPS: list[App] = [tests_app, loyalty_app, welcome_app, booking_app, shelf_app, ticker_app]


def all_services() -> list[Service]:
    """Every service of every app the tests run."""
    return [service for app in APPS for service in app.services]


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A database of this run's own, with every service's migrations applied."""
    with scratch_database() as dsn:
        runtime = Runtime(Settings(database_url=dsn))
        runtime.migrate(all_services())
        runtime.close()
        yield dsn


@pytest.fixture(scope="session")
def django_project(database_url: str) -> None:
    """Django configured once for the run, on the run's database (Django's settings are per process)."""
    import django
    from django.conf import settings

    if not settings.configured:
        parts = psycopg.conninfo.conninfo_to_dict(database_url)
        settings.configure(
            DATABASES={
                "default": {
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": parts.get("dbname"),
                    "HOST": parts.get("host"),
                    "PORT": parts.get("port", 5432),
                    "USER": parts.get("user"),
                }
            },
            INSTALLED_APPS=["django.contrib.contenttypes", "estafeta.django", "examples.shelf_django"],
            USE_TZ=True,
        )
        django.setup()


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    """A RabbitMQ URL on this run's own vhost (skips, or fails under CI, without RabbitMQ)."""
    with rabbitmq_vhost() as url:
        yield url


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis URL with this run's own key namespace (skips, or fails under CI, without Redis).

    The namespace's keys (queues, lock token counters) are deleted when the run ends.
    """
    url = redis_namespaced()
    yield url
    drop_redis_namespace()


def _wipe(dsn: str) -> None:
    wipe(dsn, [s.name for s in all_services()])


@pytest.fixture
def runtime(database_url: str) -> Iterator[Runtime]:
    """A runtime on the run's database, emptied before the test."""
    _wipe(database_url)
    runtime = Runtime(Settings(database_url=database_url, **TEST_SETTINGS))  # type: ignore[arg-type]
    yield runtime
    runtime.close()


@pytest.fixture(scope="session")
def estafeta_declared_app() -> App:
    """The plugin's app under test: the order system (the other apps share its database and runtime)."""
    return tests_app


@pytest.fixture(scope="session")
def estafeta_database_url(database_url: str) -> str:
    """The plugin's database: the run's, with every app's migrations."""
    return database_url


@pytest.fixture
def estafeta_runtime(runtime: Runtime) -> Runtime:
    """The plugin's runtime: the suite's, emptied before the test."""
    return runtime


@pytest.fixture
def conn(database_url: str, runtime: Runtime) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the run's database, for arranging and checking."""
    with psycopg.connect(database_url, autocommit=True) as connection:
        yield connection


@pytest.fixture
def schema_conn(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the run's migrated database, not emptied: for tests that only read
    the schema (hundreds of them, parametrized per service and query, would each pay the wipe)."""
    with psycopg.connect(database_url, autocommit=True) as connection:
        yield connection


@pytest.fixture
def stub_broker(runtime: Runtime) -> Iterator[StubBroker]:
    """A fresh StubBroker with every step of the tests' apps bound to it."""
    yield from bound_broker(runtime)


def bound_broker(runtime: Runtime) -> Iterator[StubBroker]:
    """A fresh StubBroker with every step of the tests' apps bound to it, running with ``runtime``."""
    broker = StubBroker()
    broker.emit_after("process_boot")
    for app in APPS:
        app.bind(broker, runtime)
    yield broker
    broker.flush_all()
    broker.close()


@pytest.fixture
def stub_worker(stub_broker: StubBroker) -> Iterator[dramatiq.Worker]:
    """A worker consuming the stub broker in this process."""
    yield from started_worker(stub_broker)


def started_worker(broker: StubBroker) -> Iterator[dramatiq.Worker]:
    """A worker consuming ``broker`` in this process, until the generator is closed."""
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=4)
    worker.start()
    yield worker
    worker.stop()


def make_relay(runtime: Runtime, broker: dramatiq.Broker, *, services: Collection[str] = (), **config: object) -> Relay:
    """A relay over every service's outbox (or only ``services``'), publishing to ``broker``."""
    defaults: dict[str, object] = {"batch_size": 100, "poll_interval": 0.05, "attempt_backoff": timedelta(0)}
    names = services or [s.name for s in all_services()]
    outboxes = [Outbox(name, runtime.database(name)) for name in names]
    return Relay(outboxes, EnqueuePublisher(broker), RelayConfig(**{**defaults, **config}))  # type: ignore[arg-type]


@pytest.fixture
def relay(runtime: Runtime, stub_broker: StubBroker) -> Relay:
    """A relay publishing to the stub broker (drive it with ``drain_once``)."""
    return make_relay(runtime, stub_broker)


@pytest.fixture
def running_relay(relay: Relay) -> Iterator[Relay]:
    """The relay running in a thread, woken by NOTIFY."""
    yield from relay_running(relay)


def relay_running(relay: Relay) -> Iterator[Relay]:
    """``relay`` running in a thread, woken by NOTIFY, until the generator is closed."""
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    thread.start()
    yield relay
    stop.set()
    thread.join(timeout=10)


@pytest.fixture(scope="session")
def lock_tables(database_url: str) -> str:
    """The run's database, with the tables of the charge-like lock test step (the probe service's)."""
    return database_url


@pytest.fixture(params=["postgres", "redis"])
def lock_url(request: pytest.FixtureRequest) -> str:
    """``ESTAFETA_LOCK_URL`` of each lock backend: tests using it are the backends' contract."""
    return "postgres" if request.param == "postgres" else str(request.getfixturevalue("redis_url"))
