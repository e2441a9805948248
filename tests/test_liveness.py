"""Every connection gets timeouts for a silent network, and a DSN or URL that sets its own keeps them.

What the timeouts do on a real silent cut is proven in tests/faults/test_no_hang.py.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pika
import pytest
from psycopg import conninfo

from estafeta_brokers import broker_from_url
from estafeta_brokers.liveness import AMQP_DEFAULTS, REDIS_DEFAULTS, with_liveness
from estafeta_sql.liveness import LIVENESS_DEFAULTS
from estafeta_sql.liveness import with_liveness as dsn_with_liveness
from estafeta_sql.pool import Database


def test_a_dsn_gets_every_default_it_lacks_and_keeps_its_own_values() -> None:
    params = conninfo.conninfo_to_dict(dsn_with_liveness("postgresql://u:secret@db:5433/shop?keepalives_idle=3"))
    assert params["keepalives_idle"] == "3"
    assert params["password"] == "secret" and params["host"] == "db" and params["port"] == "5433"
    for key, value in LIVENESS_DEFAULTS.items():
        if key != "keepalives_idle":
            assert params[key] == value


def test_pgconnect_timeout_in_the_environment_wins_over_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "2")
    assert "connect_timeout" not in conninfo.conninfo_to_dict(dsn_with_liveness("dbname=x"))


def test_the_pool_and_its_listeners_connect_with_the_defaults() -> None:
    db = Database("host=127.0.0.1 dbname=x tcp_user_timeout=1000")
    params = conninfo.conninfo_to_dict(db.dsn)
    assert params["tcp_user_timeout"] == "1000" and params["keepalives"] == "1"
    assert db.pool.conninfo == db.dsn


def test_broker_urls_get_their_scheme_s_defaults_and_keep_their_own() -> None:
    amqp = parse_qs(urlsplit(with_liveness("amqp://g:g@h:5672/%2F?heartbeat=30")).query)
    assert amqp["heartbeat"] == ["30"]
    assert amqp["blocked_connection_timeout"] == [AMQP_DEFAULTS["blocked_connection_timeout"]]
    redis = parse_qs(urlsplit(with_liveness("redis://h:6379/0")).query)
    assert {key: values[0] for key, values in redis.items()} == REDIS_DEFAULTS
    assert with_liveness("stub://") == "stub://"
    both = with_liveness("amqp://a:5672/%2F;amqp://b:5672/%2F").split(";")
    assert all("heartbeat=15" in part for part in both)


def test_the_brokers_built_from_urls_carry_the_timeouts() -> None:
    for url, hosts in (
        ("amqp://guest:guest@127.0.0.1:5672/%2F", 1),
        ("amqp://g:g@127.0.0.1:5672,127.0.0.1:5673/%2F", 2),
    ):
        rabbit = broker_from_url(url)
        parameters = rabbit.parameters  # type: ignore[attr-defined]
        assert len(parameters) == hosts  # one URL per node: pika tries them in order
        for one in parameters:
            assert isinstance(one, pika.URLParameters)
            assert one.heartbeat == 15 and one.blocked_connection_timeout == 30
    redis = broker_from_url("redis://127.0.0.1:6379/0?namespace=x")
    kwargs = redis.client.connection_pool.connection_kwargs  # type: ignore[attr-defined]
    assert kwargs["socket_timeout"] == 5 and kwargs["socket_keepalive"] is True
    assert kwargs["health_check_interval"] == 15


def test_pooled_connections_ask_the_server_to_notice_a_silent_client(database_url: str) -> None:
    db = Database(database_url)
    try:
        with db.connection() as conn:
            shown = {
                name: conn.execute(f"SHOW {name}").fetchone()[0] for name in ("tcp_user_timeout", "tcp_keepalives_idle")
            }
            assert shown == {"tcp_user_timeout": "30000", "tcp_keepalives_idle": "10"}
            if conn.info.server_version >= 140000:
                assert conn.execute("SHOW client_connection_check_interval").fetchone()[0] == "5s"
            assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0] == "1min"
    finally:
        db.close()
