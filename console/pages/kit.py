"""What every console page shares: its headers, its templates and filters, the form token and signed notices.

Each group of pages (:mod:`~estafeta_console.pages.overview_pages`, :mod:`~estafeta_console.pages.saga_pages`,
:mod:`~estafeta_console.pages.letter_pages`, :mod:`~estafeta_console.pages.actions`...) renders through one
:class:`PageKit`, so that every page carries the same security headers and every form the
same token.
"""

from __future__ import annotations

import json
import secrets
import urllib.parse
from typing import Annotated, Any

import jinja2
from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from markupsafe import Markup

from estafeta import App, Runtime

from ..data import overview as console_data
from ..server import sign_in

#: Headers of every console page: no framing (clickjacking of the actions), and no script but
#: the console's own clock (allowed by its hash: it turns times into the reader's time zone).
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none';"
        f" script-src {console_data.SCRIPT_HASH}"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
#: The charts page: as every page, but it may frame the charts (same origin only).
CHARTS_HEADERS = {
    **HEADERS,
    "Content-Security-Policy": HEADERS["Content-Security-Policy"] + "; frame-src 'self'",
}
#: The charts' frame: framed by the charts page only (same origin). It holds no form, so
#: framing it cannot trick an operator into an action.
FRAME_HEADERS = {
    **HEADERS,
    "Content-Security-Policy": HEADERS["Content-Security-Policy"].replace(
        "frame-ancestors 'none'", "frame-ancestors 'self'"
    ),
    "X-Frame-Options": "SAMEORIGIN",
}
#: The path of the charts' frame (framed, and reloading itself, even when it shows an error).
FRAME_PATH = "/console/charts/frame"
FORGED = "this form is stale or was not sent by this console: reload the page and try again"


async def form_fields(request: Request) -> dict[str, str]:
    """The fields of an ``application/x-www-form-urlencoded`` body (the last value of each)."""
    body = (await request.body()).decode("utf-8", errors="replace")
    return {name: values[-1] for name, values in urllib.parse.parse_qs(body).items()}


Form = Annotated[dict[str, str], Depends(form_fields)]


class PageKit:
    """Renders the console's pages of ``app`` (read through ``runtime``): templates, headers, token, notices."""

    def __init__(self, app: App, runtime: Runtime, *, allow_actions: bool) -> None:
        self.app = app
        self.runtime = runtime
        self.allow_actions = allow_actions
        #: Notices are shown only with this process's signature (a link cannot write one).
        self.notices = sign_in.Notices()
        # Forms carry it; a POST without it is refused (cross-site request forgery).
        self.token = secrets.token_urlsafe(32)
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("estafeta_console.pages", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters["age"] = console_data.age
        self.templates.filters["deadline"] = console_data.deadline
        self.templates.filters["when"] = console_data.when
        self.templates.filters["badge"] = console_data.badge
        self.templates.filters["past_deadline"] = console_data.past_deadline
        self.templates.globals["clock_script"] = Markup(console_data.CLOCK_SCRIPT)
        self.templates.filters["pretty"] = lambda value: json.dumps(value, indent=2, sort_keys=True, default=str)

    def page(
        self, template: str, *, status: int = 200, headers: dict[str, str] | None = None, **context: Any
    ) -> HTMLResponse:
        """``template`` rendered with ``context``, with the console's headers (``headers`` on top)."""
        context.setdefault("notice", None)
        html = self.templates.get_template(template).render(
            app=self.app, allow_actions=self.allow_actions, token=self.token, **context
        )
        return HTMLResponse(html, status_code=status, headers={**HEADERS, **(headers or {})})

    def refuse(self, why: str, *, status: int = 400) -> HTMLResponse:
        """A page saying why the request is refused (a bad filter, an unknown id), with ``status``."""
        return self.page("console_missing.html", reason=why, status=status)

    def back(self, path: str, notice: str) -> Response:
        """Redirect to ``path`` (POST, redirect, GET: a reload does not repeat an action), showing ``notice``.

        The notice is signed: the page shows no notice a link from elsewhere wrote.
        """
        query = urllib.parse.urlencode({"notice": notice, "sig": self.notices.sign(notice)})
        return RedirectResponse(f"{path}?{query}", status_code=303)

    def verified(self, notice: str | None, sig: str | None) -> str | None:
        """``notice`` when this process signed it, else ``None``."""
        return self.notices.verified(notice, sig)

    def forged(self, form: dict[str, str]) -> bool:
        """Whether ``form`` lacks this console's token (it was not sent from one of its pages)."""
        return not secrets.compare_digest(form.get("token", "").encode(), self.token.encode())
