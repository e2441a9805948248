"""``python -m tests.events.projector_process DSN SCHEMA``: a projector process for the SIGKILL test.

Runs ``SlowTotals`` (a sleep per event, so batches take long enough to be killed in the
middle) until it is killed.
"""

from __future__ import annotations

import sys
import threading
from typing import ClassVar

from estafeta.events.projections import Projector
from estafeta.events.projector_run import run_projector
from estafeta.events.store import EventStore

from .workload import Totals, registry, totals_ddl


class SlowTotals(Totals):
    name = "slow_totals"
    tables: ClassVar[dict[str, str]] = {"slow_totals": totals_ddl("slow_totals")}
    table = "slow_totals"
    delay = 0.0005


def main() -> None:
    """Project until killed."""
    dsn, schema = sys.argv[1], sys.argv[2]
    projector = Projector(SlowTotals(), EventStore(schema, registry), batch_size=200)
    run_projector(dsn, projector, threading.Event(), poll_interval=0.05)


if __name__ == "__main__":
    main()
