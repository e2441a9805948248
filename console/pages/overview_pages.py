"""The console's front page and the pages its sections lead to: failed rows, projections, events, scheduled.

The front page (``/console``) shows what waits and what failed: each service's outbox
backlog, failed outbox rows, dead letters by cause, sagas by status, stuck and failed sagas,
the processes' heartbeats and the read models. Each section links to a page of its own.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from ..data import lists as console_lists
from ..data import liveness as console_liveness
from ..data import overview as console_data
from ..data import read_models as console_models
from .kit import PageKit


class OverviewPages:
    """The front page and the read-only pages of its sections."""

    def __init__(self, kit: PageKit) -> None:
        self.kit = kit
        self.app = kit.app
        self.runtime = kit.runtime

    def add_routes(self, router: APIRouter) -> None:
        """Route the front page and its sections' pages on ``router`` (the console's)."""
        router.add_api_route("", self.overview, methods=["GET"], response_class=HTMLResponse)
        router.add_api_route("/outbox/failed", self.failed_rows, methods=["GET"], response_class=HTMLResponse)
        router.add_api_route("/projections", self.projections_page, methods=["GET"], response_class=HTMLResponse)
        router.add_api_route("/events", self.events_page, methods=["GET"], response_class=HTMLResponse)
        router.add_api_route("/outbox/scheduled", self.scheduled, methods=["GET"], response_class=HTMLResponse)

    def overview(self, notice: str | None = None, sig: str | None = None) -> HTMLResponse:
        """Outboxes, failed rows, dead letters by cause, sagas by status, stuck and failed sagas."""
        overview = console_data.read_overview(self.app, self.runtime)
        projections = console_models.read_projections(self.app, self.runtime)
        scheduled = len(console_models.read_scheduled(self.app, self.runtime))
        liveness, processes = console_liveness.read_processes(self.app, self.runtime)
        return self.kit.page(
            "console.html",
            liveness=liveness,
            processes=processes,
            overview=overview,
            projections=projections,
            scheduled=scheduled,
            scheduled_cap=console_models.SCHEDULED,
            notice=self.kit.verified(notice, sig),
        )

    def failed_rows(self, service: str = "") -> HTMLResponse:
        """Failed outbox rows with their message, of one service (``?service=``) or all."""
        try:
            rows = console_lists.read_failed_rows(self.app, self.runtime, service or None, console_lists.PAGE * 4)
        except console_lists.BadFilter as exc:
            return self.kit.refuse(str(exc))
        return self.kit.page("console_failed.html", rows=rows, service=service)

    def projections_page(self) -> HTMLResponse:
        """Every projection: position, lag in events and seconds, state, last error; the oldest open writer."""
        return self.kit.page("console_projections.html", found=console_models.read_projections(self.app, self.runtime))

    def events_page(self, request: Request) -> HTMLResponse:
        """A stream's events, as of a time or a version (``estafeta events show``); the streams written last."""
        try:
            query = console_models.parse_stream_query(self.app, request.query_params)
        except console_lists.BadFilter as exc:
            return self.kit.refuse(str(exc))
        found = console_models.read_streams(self.app, self.runtime, query)
        return self.kit.page("console_events.html", found=found, params=request.query_params)

    def scheduled(self) -> HTMLResponse:
        """Messages sent for a time not here yet, soonest first (``estafeta outbox scheduled``)."""
        return self.kit.page("console_scheduled.html", rows=console_models.read_scheduled(self.app, self.runtime))
