"""``dramatiq examples.shelf.worker``: the shelf's steps, bound to ``ESTAFETA_BROKER_URL``'s broker.

Kept apart from the app's module, which web processes import without binding anything.
"""

from __future__ import annotations

from . import app

broker = app.bind().broker
