"""The tests' app: the probe service's test-only steps, around the order system.

``dramatiq tests.app`` serves both (the order system's steps and the probe's), bound to
the broker of the ``ESTAFETA_*`` settings; tests bind :data:`app` to fresh StubBrokers.
"""

from __future__ import annotations

from estafeta import App
from estafeta_actors.app import app as order_system

from . import lock_steps, probe_sagas, steps
from .probe import SERVICE as probe

#: The order system plus the probe service; the probe's steps can send to the order system's.
app = App("tests", services=[probe], include=[order_system])

__all__ = ["app", "lock_steps", "probe_sagas", "steps"]

#: Every step of the tests' app, by actor name.
STEPS = app.steps
