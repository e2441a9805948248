"""The console's errors as pages: HTML with what went wrong and a link to try again, never a problem document.

The HTTP server answers its API's errors as ``application/problem+json``; a person reading
the console at the moment the database restarts gets a page instead, with its status, its
``Retry-After`` and a retry link. The charts' frame gets a page that reloads itself as the
charts do, so the charts come back on their own once the database does.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import Request
from fastapi.responses import HTMLResponse

from .kit import FRAME_HEADERS, FRAME_PATH, PageKit

#: What a person does about each kind of error, by status.
_ADVICE = {
    401: "Give the operator's password when the browser asks for it.",
    404: "Check the address, or go back to the console.",
    429: "Wait, then try again.",
    503: "The console will answer once the database is back: try again in a few seconds.",
}


def is_console_path(path: str) -> bool:
    """Whether ``path`` is one of the console's (``/console`` or under it)."""
    return path == "/console" or path.startswith("/console/")


class ErrorPages:
    """The console's error pages, rendered through ``kit``."""

    def __init__(self, kit: PageKit, *, refresh_seconds: int) -> None:
        self.kit = kit
        #: How often the charts' frame reloads itself, error or not.
        self.refresh_seconds = refresh_seconds

    def page(
        self, request: Request, status: int, title: str, detail: str, headers: Mapping[str, str] | None = None
    ) -> HTMLResponse:
        """The page of an error of ``request``: ``title`` and ``detail``, and a link to ask again."""
        retry = _retry_link(request)
        advice = _ADVICE.get(status, "Try again; if it keeps failing, the server's log says why.")
        extra = dict(headers or {})
        if request.url.path == FRAME_PATH:
            return self.kit.page(
                "console_frame_error.html",
                status=status,
                headers={**FRAME_HEADERS, **extra},
                title=title,
                detail=detail,
                retry=retry,
                refresh=self.refresh_seconds,
            )
        return self.kit.page(
            "console_error.html",
            status=status,
            headers=extra,
            title=title,
            detail=detail,
            advice=advice,
            retry=retry,
            path=request.url.path,
        )


def _retry_link(request: Request) -> str:
    """Where the retry link leads: the page asked for; after a failed form, the page the form was on."""
    if request.method == "GET":
        query = request.url.query
        return request.url.path + (f"?{query}" if query else "")
    return "/console"
