"""Where a service's outbox lives: its schema and the database that holds it.

Apart from :mod:`estafeta_brokers.relay`, which drains such outboxes, because the relay's metrics
(:mod:`estafeta_brokers.metrics`) read the same outboxes at scrape time and the relay reports to
those metrics: each names the outboxes from here instead of from the other.
"""

from __future__ import annotations

import attrs

from estafeta_sql.pool import Database


@attrs.frozen
class Outbox:
    """One service's outbox: its schema and the database it lives in."""

    schema: str
    database: Database
