"""``dramatiq tests.worker``: the tests' app (the order system and the probe's test-only steps)."""

from tests.app import app

#: The tests' app bound to the broker of the ``ESTAFETA_*`` settings.
binding = app.bind()
