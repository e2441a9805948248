"""``dramatiq tests.ticker_worker``: the ticker app on the broker of the ESTAFETA_* settings (firing its schedules)."""

from __future__ import annotations

from .ticker import app

binding = app.bind()
