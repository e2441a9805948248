"""The operator console (``/console``): what waits, what failed and which sagas are stuck, from PostgreSQL.

Server-rendered pages (no build step, one small inline script of its own that shows times
in the reader's time zone) about any app: each service's outbox backlog and its oldest
wait, failed outbox rows, scheduled messages, dead letters grouped by cause, sagas by
status, stuck and failed sagas, one saga's timeline and diagram, projections and their
lag, the event streams, and the recurring schedules. Everything is read from the
services' databases, so the console shows the same on RabbitMQ, Redis or any broker.

It is read-only unless ``estafeta serve --allow-actions``: then it can put failed outbox
rows back in line, replay a group of dead letters, and resume or abort a saga, through the
same calls as ``estafeta outbox retry``, ``estafeta dead-letters replay --group``,
``estafeta sagas resume`` and ``estafeta sagas abort``. Actions are POST
forms carrying a token of this process (a page elsewhere cannot forge them), and pages
forbid framing and every script but that one, allowed by its hash (the charts' frame alone
may be framed, by the same origin).

With an operator password (``ESTAFETA_CONSOLE_PASSWORD``, required for the actions) every
console route, pages included, asks for it by HTTP Basic auth: the browser's own prompt,
no script and no session to sign, and the form token is handed only to who gave it. Basic
auth sends the password with each request: serve the console over TLS or on loopback only.
Wrong passwords are slowed, then locked out, per client (:mod:`estafeta_console.server.sign_in`), and an
action's notice is shown only with this process's signature.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import math

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from estafeta import App, Problem, Runtime
from estafeta.app.settings import CONSOLE_PASSWORD_MIN_LENGTH

from .. import charts as console_charts
from ..data import lists as console_lists
from ..server import sign_in
from . import schedules as console_schedules
from .actions import Actions
from .chart_pages import ChartPages
from .errors import ErrorPages
from .kit import PageKit
from .letter_pages import LetterPages
from .overview_pages import OverviewPages
from .saga_pages import SagaPages

logger = logging.getLogger(__name__)


class Console:
    """The console's routes for ``app``, reading through ``runtime``'s pools.

    Its pages are grouped by what they show: the front page and its sections
    (:mod:`~estafeta_console.pages.overview_pages`), sagas (:mod:`~estafeta_console.pages.saga_pages`), dead
    letters (:mod:`~estafeta_console.pages.letter_pages`), charts (:mod:`~estafeta_console.pages.chart_pages`),
    schedules, and the actions (:mod:`~estafeta_console.pages.actions`); errors are pages too
    (:mod:`~estafeta_console.pages.errors`).
    """

    def __init__(self, app: App, runtime: Runtime, *, allow_actions: bool = False, password: str | None = None) -> None:
        if allow_actions and not password:
            raise ValueError("the console's actions need an operator password (ESTAFETA_CONSOLE_PASSWORD)")
        if password is not None and len(password) < CONSOLE_PASSWORD_MIN_LENGTH:
            raise ValueError(f"the console's password needs at least {CONSOLE_PASSWORD_MIN_LENGTH} characters")
        self.app = app
        self.runtime = runtime
        self.allow_actions = allow_actions
        self._password = password
        #: Wrong passwords per client: slowed, then locked out.
        self.sign_ins = sign_in.SignIns()
        self.kit = PageKit(app, runtime, allow_actions=allow_actions)
        #: The console's errors as HTML pages (the HTTP server's exception handlers use them).
        self.errors = ErrorPages(self.kit, refresh_seconds=console_charts.REFRESH_SECONDS)
        self.sagas = SagaPages(self.kit)
        #: The routes, for ``FastAPI.include_router``.
        self.router = APIRouter(prefix="/console", dependencies=[Depends(self._operator)] if password else [])
        OverviewPages(self.kit).add_routes(self.router)
        self.sagas.add_routes(self.router)
        LetterPages(self.kit).add_routes(self.router)
        ChartPages(self.kit).add_routes(self.router)
        console_schedules.add_routes(self.router, app, runtime, self.kit.page)
        if allow_actions:
            Actions(self.kit, self.sagas).add_routes(self.router)

    def saga_list_html(self, listed: console_lists.SagaList) -> HTMLResponse:
        """The page of a saga list as read (``bench.console_pages`` draws one of any length)."""
        return self.sagas.saga_list_html(listed)

    def _operator(self, request: Request) -> str:
        """The operator's user name, once the request carries the password (HTTP Basic auth); else 401.

        A client that keeps sending wrong passwords is slowed, then locked out (429, see
        :mod:`estafeta_console.server.sign_in`); a request with no credentials (a browser before its prompt)
        costs nothing.
        """
        assert self._password is not None
        client = request.client.host if request.client else ""
        refused = self.sign_ins.refusal(client)
        if refused is not None:
            raise _too_many(*refused)
        scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
        try:
            user, _, given = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            user, given = "", ""
        # Constant time: how long the check takes says nothing about how much of the password matched.
        if scheme.lower() == "basic" and hmac.compare_digest(given.encode(), self._password.encode()):
            self.sign_ins.succeeded(client)
            if request.method != "GET":  # who did what, for the morning after
                logger.warning("console: %s %s by operator %r", request.method, request.url.path, user[:64])
            return user
        if scheme:  # a guess: counted (a metric), never logged one by one
            lockout = self.sign_ins.failed(client)
            if lockout is not None:
                raise _too_many(sign_in.Refusal.LOCKED_OUT, lockout)
        raise Problem(
            "the console needs the operator's password (HTTP Basic auth; any user name)",
            status=401,
            title="Unauthorized",
            headers={"WWW-Authenticate": 'Basic realm="estafeta console", charset="UTF-8"'},
        )


def _too_many(why: sign_in.Refusal, wait: float) -> Problem:
    what = "locked out" if why is sign_in.Refusal.LOCKED_OUT else "slowed down"
    return Problem(
        f"too many wrong operator passwords from this address: {what}, try again in {math.ceil(wait)} s",
        status=429,
        title="Too Many Requests",
        headers={"Retry-After": str(math.ceil(wait))},
    )
