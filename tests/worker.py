"""``dramatiq tests.integration.worker_locks``: the services plus the charge-like test steps."""

import actors
from actors.step import bind
from tests import lock_steps  # noqa: F401  (declares the charge steps)

bind(actors.broker, actors.runtime)
