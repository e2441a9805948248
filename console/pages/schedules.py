"""The console's schedules page (``/console/schedules``): what ``estafeta schedules list`` shows.

Read only: a schedule's next and last firing, what became of its last run, its counts and
its last outcome, from the services' schedules tables. Pausing, resuming and triggering
stay with ``estafeta schedules`` (an operator's command, logged where it ran).
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from estafeta import App, Runtime, Scheduler

#: How the console renders a page: a template's name and what it shows.
Render = Callable[..., HTMLResponse]


def add_routes(router: APIRouter, app: App, runtime: Runtime, page: Render) -> None:
    """Route ``/schedules`` on ``router`` (the console's), reading ``app``'s schedules through ``runtime``."""

    def schedules_page() -> HTMLResponse:
        """Every declared schedule: timing, policies, next and last firing, last run, last outcome."""
        states = Scheduler(runtime, app.schedules).states()
        return page("console_schedules.html", schedules=[s.as_dict() for s in states])

    router.add_api_route("/schedules", schedules_page, methods=["GET"], response_class=HTMLResponse)
