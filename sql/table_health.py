"""Vacuum statistics of a service's high-churn tables, read from ``pg_stat_user_tables``.

The outbox (a row deleted per message published), the inbox and ``inbox_attempts`` (pruned
in bulk) churn constantly. If autovacuum falls behind — a long transaction holds back the
xmin horizon, or autovacuum is off for the table — their dead tuples pile up and every claim
scans them: seed 000 asks to watch it.
"""

from __future__ import annotations

from typing import Any

import attrs
import psycopg

from .queries import query

#: The tables whose vacuum state is reported, in every service schema.
CHURNING_TABLES = ("outbox", "inbox", "inbox_attempts")


@attrs.frozen
class VacuumStats:
    """One table's dead tuples and when autovacuum last cleaned it."""

    table: str
    #: Dead row versions the statistics system counts (an estimate).
    dead_tuples: int
    #: Unix time of the last autovacuum of the table; 0 if it never ran.
    last_autovacuum: float


def vacuum_stats(conn: psycopg.Connection[Any], schema: str) -> list[VacuumStats]:
    """The vacuum state of ``schema``'s :data:`CHURNING_TABLES` (those that exist), by table name."""
    params = {"schema": schema, "tables": list(CHURNING_TABLES)}
    rows = conn.execute(query("vacuum_stats", schema, "table_health.sql"), params).fetchall()
    return [VacuumStats(str(r[0]), int(r[1]), float(r[2])) for r in rows]
