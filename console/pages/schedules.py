"""The console's schedules page (``/console/schedules``): what ``estafeta schedules list`` shows.

Read only: a schedule's next and last firing, what became of its last run, its counts and
its last outcome, from the services' schedules tables. Pausing, resuming and triggering
stay with ``estafeta schedules`` (an operator's command, logged where it ran).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi.responses import HTMLResponse

from estafeta import Scheduler

if TYPE_CHECKING:
    from .routes import Console


def add_routes(console: Console) -> None:
    """Route ``/console/schedules`` on ``console``'s router."""

    def schedules_page() -> HTMLResponse:
        """Every declared schedule: timing, policies, next and last firing, last run, last outcome."""
        states = Scheduler(console.runtime, console.app.schedules).states()
        return console._page("console_schedules.html", schedules=[s.as_dict() for s in states])

    console.router.add_api_route("/schedules", schedules_page, methods=["GET"], response_class=HTMLResponse)
