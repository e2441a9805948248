"""Assembling relays for a runtime: pools of their own, the batched publisher, lanes side by side."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import dramatiq
from psycopg import conninfo

from estafeta.app.deployment import deployment_name
from estafeta.app.runtime import Runtime
from estafeta_brokers import wait_replicas
from estafeta_brokers.outboxes import Outbox
from estafeta_brokers.publish import durability_warning, publisher_for
from estafeta_brokers.relay import Relay, RelayConfig
from estafeta_brokers.tracing import messaging_system
from estafeta_sql.pool import Database

logger = logging.getLogger(__name__)

#: ``application_name`` of the relay's pooled connections (``pg_stat_activity``).
APPLICATION_NAME = "estafeta-relay"


def build_relay(runtime: Runtime, broker: dramatiq.Broker, services: Sequence[str], **overrides: Any) -> Relay:
    """A relay over the outboxes of ``services``, configured from the runtime's settings.

    The relay gets pools of its own, named ``estafeta-relay`` in ``pg_stat_activity``,
    one per database (services sharing a database share it). Every message it publishes
    names the runtime's deployment (``estafeta.app.deployment``). ``overrides``:
    ``batch_size``, ``poll_interval``, ``attempt_backoff``, ``confirm_timeout``.
    """
    settings = runtime.settings
    config = RelayConfig(
        batch_size=overrides.get("batch_size") or settings.relay_batch_size,
        poll_interval=overrides.get("poll_interval") or settings.relay_poll_interval,
        max_attempts=settings.relay_max_attempts,
        attempt_backoff=overrides.get("attempt_backoff") or timedelta(seconds=1),
        wait_standbys=settings.relay_wait_standbys,
    )
    databases: dict[str, Database] = {}
    outboxes = []
    for name in services:
        dsn = runtime.dsn_for(name)
        if dsn not in databases:
            named = conninfo.make_conninfo(dsn, application_name=APPLICATION_NAME)
            databases[dsn] = Database(named, min_size=1, max_size=2)
        outboxes.append(Outbox(name, databases[dsn]))
    options: dict[str, Any] = (
        {"confirm_timeout": overrides["confirm_timeout"]} if overrides.get("confirm_timeout") else {}
    )
    replicas = wait_replicas(settings.broker_url)
    if replicas:
        options["wait_replicas"] = replicas
    relay = Relay(outboxes, publisher_for(broker, **options), config, system=messaging_system(broker))
    # Asked of the databases when the first batch goes out, not now: a relay starts without them.
    relay.deployment = functools.partial(deployment_name, runtime)
    return relay


def close_relay(relay: Relay) -> None:
    """Close the relay's broker connection and database pools."""
    relay.publisher.close()
    for database in {id(o.database): o.database for o in relay.outboxes}.values():
        database.close()


def _warn_unless_durable(relay: Relay) -> None:
    warning = durability_warning(relay.publisher)
    if warning:
        logger.warning("relay: %s", warning)


def run_lanes(relays: list[Relay], stop: threading.Event) -> None:
    """Run ``relays`` side by side until ``stop``.

    A lane does not stop on its own (a relay backs off and carries on after any error);
    should one die all the same (``SystemExit``, ``KeyboardInterrupt``), it stops them
    all and is re-raised.

    Each lane claims its own batches, so one lane's database round trips overlap the
    other's wait for broker confirms; per-key order holds across lanes as it does
    across relay processes.
    """
    if relays:
        # Beside the lanes, not before them: a broker that does not answer the question
        # must not hold back the first batch, whose failure says so within its bound.
        threading.Thread(
            target=_warn_unless_durable, args=(relays[0],), name="estafeta-relay-durability", daemon=True
        ).start()
    errors: list[BaseException] = []

    def lane(relay: Relay) -> None:
        try:
            relay.run(stop)
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=lane, args=(r,), name=f"estafeta-relay-lane-{i}") for i, r in enumerate(relays)]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)  # short joins: the main thread must stay free for signal handlers
    if errors:
        raise errors[0]
