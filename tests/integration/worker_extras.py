"""``dramatiq actors tests.integration.worker_extras``: the services plus the test-only steps."""

import actors
from actors.step import bind
from tests import steps  # noqa: F401  (declares the test-only steps)

bind(actors.broker, actors.runtime)
