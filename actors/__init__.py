"""The order system, built on estafeta: ``dramatiq estafeta_actors`` serves it.

Importing this package binds the app (:mod:`estafeta_actors.app`) to the broker named by
``ESTAFETA_BROKER_URL`` and makes it Dramatiq's global broker, which is what the
``dramatiq`` command needs from the module it imports; a bad setting stops the process
with one line and exit code 2. Tests bind the same app to a fresh StubBroker with
``app.bind(StubBroker(), runtime)``.
"""

from __future__ import annotations

from .app import app

#: The app bound to the broker of this process's settings.
binding = app.bind()
#: The broker every step of this process is bound to.
broker = binding.broker
#: This process's settings, pools and lock backend.
runtime = binding.runtime
settings = runtime.settings

__all__ = ["app", "binding", "broker", "runtime", "settings"]
