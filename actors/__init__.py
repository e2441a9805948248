"""Everything a Dramatiq worker runs: ``dramatiq actors`` serves every service.

Importing this package reads the settings, builds the broker named by
``ESTAFETA_BROKER_URL`` and makes it Dramatiq's global broker *before* the service
modules are imported, then binds every declared step to it. (An actor binds to the
global broker when it is declared; with none set, Dramatiq would silently create a
RabbitMQ one.) Tests bind the same steps to a fresh StubBroker with
:func:`actors.step.bind`.
"""

from __future__ import annotations

import sys

import dramatiq

from brokers import broker_from_url

from .errors import SettingsError
from .runtime import Runtime
from .settings import Settings

try:
    settings = Settings.from_env()
except SettingsError as _exc:
    print(f"estafeta: {_exc}", file=sys.stderr)
    raise SystemExit(2) from None

#: The broker every step of this process is bound to.
broker = broker_from_url(settings.broker_url)
dramatiq.set_broker(broker)

#: This process's pools and lock backend.
runtime = Runtime(settings)

from . import order_saga, pingpong  # noqa: E402  (services import after the broker is set)
from .saga_watch import WatchdogMiddleware  # noqa: E402
from .step import bind  # noqa: E402

pingpong.SERVICE  # noqa: B018  (imported for its steps)
order_saga.ORDER_SAGA  # noqa: B018  (imported for the four order services and their saga)

# Every worker process watches saga deadlines: restarting the workers resumes every saga.
broker.add_middleware(WatchdogMiddleware(runtime))

#: Every step of every service, as Dramatiq actors on :data:`broker`.
bound_actors = bind(broker, runtime)
