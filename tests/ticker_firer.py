"""``python -m tests.ticker_firer``: a scheduler pass over the ticker's ``interrupted`` schedule, whose function hangs.

It prints ``firing <tick>`` from inside the firing transaction (the schedule's row locked,
the tick not committed) and then waits to be killed: a worker SIGKILLed while it fires a
tick. The ESTAFETA_* settings say where the database is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from estafeta import CatchUp, Overlap, Runtime, Schedule, Scheduler, Settings
from estafeta.schedules.spec import Every

from .ticker import SERVICE


def interrupted(fn: Callable[[datetime], Any]) -> Schedule:
    """The ticker's ``interrupted`` schedule (every minute, catch-up ``last``) sending what ``fn`` returns."""
    return Schedule(
        SERVICE,
        "interrupted",
        Every(timedelta(minutes=1)),
        fn,
        overlap=Overlap.ALLOW,
        catch_up=CatchUp.LAST,
        grace=timedelta(minutes=1),
    )


def _hang(tick: datetime) -> None:
    print(f"firing {tick.isoformat()}", flush=True)
    time.sleep(600)


def main() -> None:
    """Fire the due tick of ``interrupted`` with a function that never returns."""
    schedule = interrupted(_hang)
    Scheduler(Runtime(Settings.from_env()), [schedule]).fire(schedule)


if __name__ == "__main__":
    main()
