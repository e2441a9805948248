"""Commands that need the broker check it answers before they change anything."""

from __future__ import annotations

import click
import dramatiq

from estafeta import Runtime
from estafeta_brokers.reachable import BrokerUnreachable, check_reachable


def check_broker(runtime: Runtime, broker: dramatiq.Broker) -> None:
    """A usage error (exit 2, one line naming ``ESTAFETA_BROKER_URL``, password masked) unless ``broker`` answers."""
    try:
        check_reachable(broker)
    except BrokerUnreachable as exc:
        raise click.UsageError(
            f"the broker of ESTAFETA_BROKER_URL ({runtime.settings.redacted_broker_url}) does not answer: {exc};"
            " start it or fix the URL (nothing was placed)"
        ) from None
