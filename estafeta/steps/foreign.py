"""Messages of another deployment: never run, parked as dead letters, said once per deployment in the log.

Each relay names its deployment in the messages it publishes (``estafeta_brokers.deployments``). A
worker that receives a message naming another deployment parks it in its own service's dead
letters, with a reason naming both, and acknowledges it: running it would apply another
deployment's command to this one's tables. A message naming no deployment (sent with
``actor.send``, or published by a relay of an earlier version during an upgrade) is run.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import dramatiq

from estafeta.app.deployment import deployment_name
from estafeta.app.runtime import Runtime
from estafeta_brokers.deployments import DEPLOYMENT_OPTION

# A delivery's log lines come from one logger, whichever module writes them.
logger = logging.getLogger("estafeta.steps.delivery")

#: What to do about it, in every refusal's reason and log line.
ADVICE = (
    "two deployments share the broker's queues; give each its own RabbitMQ vhost, Redis namespace"
    " or Kafka topic prefix (docs/how-to/run-for-real.md)"
)

#: The (foreign, own) deployment pairs this process has said it refuses.
_told: set[tuple[str, str]] = set()
_mutex = threading.Lock()


def refusal(runtime: Runtime, message: dramatiq.Message[Any]) -> str | None:
    """Why ``message`` must not run here (it names another deployment), or ``None`` (ours, or unnamed).

    The first refusal of each foreign deployment in this process logs one line; later ones
    are only parked. Raises :class:`estafeta_sql.errors.DatabaseUnavailable` if this deployment's
    name must be asked of a database that cannot be reached (the delivery is retried).
    """
    theirs = message.options.get(DEPLOYMENT_OPTION)
    if theirs is None:
        return None
    ours = deployment_name(runtime)
    if theirs == ours:
        return None
    reason = f"message of deployment {theirs} refused by deployment {ours}: {ADVICE}"
    with _mutex:
        first = (str(theirs), ours) not in _told
        _told.add((str(theirs), ours))
    if first:
        logger.error(
            "messages of deployment %s reach deployment %s (first: %s on queue %s): each is parked as a dead"
            " letter, never run; %s",
            theirs,
            ours,
            message.actor_name,
            message.queue_name,
            ADVICE,
        )
    return reason
