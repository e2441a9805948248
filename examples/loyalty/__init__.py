"""A service outside estafeta, and an idempotent HTTP endpoint in front of it: an app of its own.

Serve it with ``dramatiq examples.loyalty``, manage it with ``estafeta --app
examples.loyalty migrate`` and ``estafeta --app examples.loyalty relay``;
``python -m examples.loyalty.http`` starts the HTTP endpoint. Importing this package
binds the app to the broker of the ``ESTAFETA_*`` settings, as ``dramatiq`` needs.
"""

from __future__ import annotations

from .service import app

#: The loyalty app bound to this process's broker.
binding = app.bind()

__all__ = ["app", "binding"]
