"""Services on separate servers: one server's long writer holds back that server's projections only, and says so.

Transaction ids, and so the event store's gap safety, are per server. The projections'
status and the oldest-writer gauge must name the server (the services on it) whose
projections an open writing transaction holds back, never blame the others.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from prometheus_client import REGISTRY

from estafeta import Projection, Projector
from estafeta.events.projection_ops import refresh_lag
from estafeta_actors import order_events, payments

from .integration.processes import estafeta, service_env
from .pg_servers import private_postgres

pytestmark = pytest.mark.heavy


class Watching(Projection):
    """A projection that only watches its log (its lag is what is measured here)."""

    name = "watching"
    handles_any = True


def test_a_long_writer_on_one_server_is_reported_for_that_servers_projections_only() -> None:
    with contextlib.ExitStack() as stack:
        shop, ledger = stack.enter_context(private_postgres()), stack.enter_context(private_postgres())
        env = service_env(shop.dsn(), "stub://", ESTAFETA_PAYMENTS_DATABASE_URL=ledger.dsn())
        assert estafeta(env, "migrate").returncode == 0
        writer = stack.enter_context(ledger.connect())
        writer.autocommit = False
        writer.execute("SELECT pg_current_xact_id()")  # a writing transaction, left open on the ledger's server

        done = estafeta(env, "projections", "status", "--json")
        assert done.returncode == 0, done.stderr
        [held] = [w for w in json.loads(done.stdout)["oldest_writers"] if w["pid"] == writer.info.backend_pid]
        assert held["services"] == ["payments"]  # not orders: its server's transaction ids are its own

        with shop.connect() as on_shop, ledger.connect() as on_ledger:
            refresh_lag(on_shop, Projector(Watching(), order_events.STORE), (0, 0))
            refresh_lag(on_ledger, Projector(Watching(), payments.STORE), (0, 0))
        gauge = "estafeta_projection_oldest_writer_age_seconds"
        assert REGISTRY.get_sample_value(gauge, {"schema": "payments"}) > 0
        assert REGISTRY.get_sample_value(gauge, {"schema": "orders"}) == 0
