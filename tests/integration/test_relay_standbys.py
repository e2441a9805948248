"""``ESTAFETA_RELAY_WAIT_STANDBYS``: with asynchronous replication, never publish what a failover can lose.

An asynchronous standby is cut off its primary, orders are placed (each with its saga and the
command it sends through the outbox), the relay drains, the primary crashes and the standby
is promoted. Publishing at once, the broker holds commands for sagas the new primary has
never heard of: their effect elsewhere (a payment) has no cause left. Waiting for one
standby, the relay holds those rows back, and they are lost with their sagas, whole.
"""

from __future__ import annotations

from collections.abc import Iterator

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from estafeta_brokers.outboxes import Outbox
from estafeta_brokers.publish import publisher_for
from estafeta_brokers.relay import Relay, RelayConfig
from estafeta_sql.errors import StandbysBehind
from estafeta_sql.pool import Database

from ..pg_servers import PostgresServer, private_postgres
from .processes import estafeta, service_env

pytestmark = pytest.mark.heavy


def _place(env: dict[str, str], prefix: str, count: int) -> None:
    place = ["orders", "place", "--count", str(count), "--amount", "100", "--quantity", "1"]
    done = estafeta(env, *place, "--customer", f"{prefix}c", "--sku", f"{prefix}s")
    assert done.returncode == 0, done.stderr


def _declare_queues(broker: StubBroker, server: PostgresServer) -> None:
    with server.connect() as conn:
        for (queue,) in conn.execute("SELECT DISTINCT queue_name FROM orders.outbox").fetchall():
            broker.declare_queue(queue)


def _sent_sagas(broker: StubBroker) -> Iterator[str]:
    """The saga of every message in the broker's queues."""
    for queue in broker.queues.values():
        while not queue.empty():
            message = dramatiq.Message.decode(queue.get_nowait())
            yield str(message.options["saga_id"])


@pytest.mark.parametrize("wait_standbys", [0, 1])
def test_a_relay_waiting_for_a_standby_never_publishes_what_a_failover_loses(wait_standbys: int) -> None:
    with private_postgres() as primary:
        standby = primary.standby(synchronous=False)
        env = service_env(primary.dsn(), "stub://")
        assert estafeta(env, "migrate").returncode == 0
        broker = StubBroker()
        database = Database(primary.dsn())
        config = RelayConfig(wait_standbys=wait_standbys, standby_timeout=2.0)
        relay = Relay([Outbox("orders", database)], publisher_for(broker), config)
        try:
            _place(env, "kept-", 5)
            _declare_queues(broker, primary)
            standby.replayed(primary)
            assert relay.drain_once() == 5  # replicated: published either way
            standby.stop_streaming()
            _place(env, "lost-", 5)
            if wait_standbys:
                with pytest.raises(StandbysBehind, match="0 of the 1 standby"):
                    relay.drain_once()
            else:
                assert relay.drain_once() == 5
        finally:
            database.close()
        primary.stop("immediate")
        standby.promote()
        with standby.connect() as conn:
            known = {str(r[0]) for r in conn.execute("SELECT saga_id FROM orders.saga_order").fetchall()}
        orphans = [saga for saga in _sent_sagas(broker) if saga not in known]
        # Publishing at once, the 5 commands of the lost sagas are out; waiting, none is.
        assert len(orphans) == (0 if wait_standbys else 5), orphans
