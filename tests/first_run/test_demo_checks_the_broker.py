"""`estafeta demo` checks the broker before it places anything: a broker that does not answer is one line, exit 2."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from ..helpers import scalar
from ..integration.processes import estafeta, service_env
from ..services import free_port


def _nothing_written(conn: psycopg.Connection[Any]) -> None:
    assert scalar(conn, "SELECT count(*) FROM orders.orders") == 0
    assert scalar(conn, "SELECT count(*) FROM payments.accounts") == 0


def test_demo_with_the_broker_down_names_it_and_places_nothing(
    conn: psycopg.Connection[Any], database_url: str
) -> None:
    broker = f"amqp://guest:hunter2@127.0.0.1:{free_port()}/shop"
    result = estafeta(service_env(database_url, broker), "demo", "--orders", "5", "--timeout", "600", timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr
    assert result.stderr.startswith("estafeta demo: the broker of ESTAFETA_BROKER_URL (amqp://guest:***@127.0.0.1:"), (
        result.stderr
    )
    assert "does not answer" in result.stderr and "nothing was placed" in result.stderr
    assert "hunter2" not in result.stderr
    _nothing_written(conn)


@pytest.mark.parametrize("wrong", ["password", "vhost"])
def test_demo_with_a_broker_that_refuses_says_why(
    conn: psycopg.Connection[Any], database_url: str, amqp_url: str, wrong: str
) -> None:
    parts = urlsplit(amqp_url)
    if wrong == "password":
        parts = parts._replace(netloc=f"{parts.username}:hunter2@{parts.hostname}:{parts.port or 5672}")
        reason = "the login was refused (user or password)"
    else:
        parts = parts._replace(path="/estafeta-no-such-vhost")
        reason = "no access to the vhost 'estafeta-no-such-vhost'"
    result = estafeta(service_env(database_url, urlunsplit(parts)), "demo", "--orders", "5", timeout=120)
    assert result.returncode == 2, result.stderr
    assert reason in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    _nothing_written(conn)
