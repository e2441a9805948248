"""The console's charts (``/console/charts``): a page with a window to choose, and the frame that redraws itself.

The frame reloads itself (a meta refresh: no script) every
:data:`estafeta_console.charts.REFRESH_SECONDS`; an error in the frame is a page that reloads itself
too (:mod:`estafeta_console.pages.errors`), so the charts come back on their own.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from .. import charts as console_charts
from .kit import CHARTS_HEADERS, FRAME_HEADERS, FRAME_PATH, PageKit

#: The windows offered, in minutes.
WINDOWS = (15, 60, 180, 720, 1440)


class ChartPages:
    """The charts page and its frame."""

    def __init__(self, kit: PageKit) -> None:
        self.kit = kit

    def add_routes(self, router: APIRouter) -> None:
        """Route ``/charts`` and its frame on ``router`` (the console's)."""
        router.add_api_route("/charts", self.charts_page, methods=["GET"], response_class=HTMLResponse)
        frame = FRAME_PATH.removeprefix("/console")
        router.add_api_route(frame, self.charts_frame, methods=["GET"], response_class=HTMLResponse)

    def charts_page(self, window: str = "") -> HTMLResponse:
        """The charts over a window, in a frame that redraws itself (a meta refresh: no script)."""
        try:
            minutes = console_charts.parse_window(window)
        except console_charts.BadWindow as exc:
            return self.kit.refuse(str(exc))
        return self.kit.page(
            "console_charts.html",
            headers=CHARTS_HEADERS,
            window=minutes,
            windows=WINDOWS,
            refresh=console_charts.REFRESH_SECONDS,
        )

    def charts_frame(self, window: str = "") -> HTMLResponse:
        """The charts alone, as the charts page frames them; the frame reloads every few seconds."""
        try:
            minutes = console_charts.parse_window(window)
        except console_charts.BadWindow as exc:
            return self.kit.refuse(str(exc))
        charts = console_charts.read_charts(self.kit.app, self.kit.runtime, minutes)
        drawn = [(chart, console_charts.render(chart)) for chart in charts]
        return self.kit.page(
            "console_chart_frame.html",
            headers=FRAME_HEADERS,
            charts=drawn,
            window=minutes,
            refresh=console_charts.REFRESH_SECONDS,
        )
