"""The ASGI app ``bench.http`` serves: ``estafeta serve``'s, with the Idempotency-Key optional.

``uvicorn --factory bench.http_app:create`` (``ESTAFETA_*`` settings as for any process):
the same ``POST /orders`` answers requests with a key (the record in the order's
transaction) and requests without one (no record), so one server measures both.
"""

from __future__ import annotations

from fastapi import FastAPI

from estafeta import Runtime, Settings
from estafeta_actors.app import app as order_system
from estafeta_actors.http import ApiOptions, OrderApi
from estafeta_console.server.web import WebOptions, create_app


def create() -> FastAPI:
    """The order API with keys optional, /health and the console."""
    runtime = Runtime(Settings.from_env())
    api = OrderApi(runtime, ApiOptions(require_idempotency_key=False))
    return create_app(order_system, runtime, WebOptions(), routers=[api.router])
