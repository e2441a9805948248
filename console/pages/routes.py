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
Wrong passwords are slowed, then locked out, per client (:mod:`console.server.sign_in`), and an
action's notice is shown only with this process's signature.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
import math
import secrets
import urllib.parse
import uuid
from typing import Annotated, Any

import jinja2
from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from markupsafe import Markup

from estafeta import App, Problem, Runtime, SagaError, SagaNotFound
from estafeta.app.settings import CONSOLE_PASSWORD_MIN_LENGTH
from estafeta.operations.dead_letter_replay import ReplayOutcome, replay
from sql import outbox_admin

from .. import charts as console_charts
from .. import saga_diagram, saga_labels
from ..data import lists as console_lists
from ..data import liveness as console_liveness
from ..data import overview as console_data
from ..data import read_models as console_models
from ..server import sign_in
from . import schedules as console_schedules

logger = logging.getLogger(__name__)
#: Headers of every console page: no framing (clickjacking of the actions), and no script but
#: the console's own clock (allowed by its hash: it turns times into the reader's time zone).
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none';"
        f" script-src {console_data.SCRIPT_HASH}"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
#: The charts page: as every page, but it may frame the charts (same origin only).
_CHARTS_HEADERS = {
    **_HEADERS,
    "Content-Security-Policy": _HEADERS["Content-Security-Policy"] + "; frame-src 'self'",
}
#: The charts' frame: framed by the charts page only (same origin). It holds no form, so
#: framing it cannot trick an operator into an action.
_FRAME_HEADERS = {
    **_HEADERS,
    "Content-Security-Policy": _HEADERS["Content-Security-Policy"].replace(
        "frame-ancestors 'none'", "frame-ancestors 'self'"
    ),
    "X-Frame-Options": "SAMEORIGIN",
}


#: Replay outcomes that leave a letter parked: the console's notice gives their reasons.
_LEFT_PARKED = (ReplayOutcome.SKIPPED, ReplayOutcome.FAILED)
_FORGED = "this form is stale or was not sent by this console: reload the page and try again"


async def form_fields(request: Request) -> dict[str, str]:
    """The fields of an ``application/x-www-form-urlencoded`` body (the last value of each)."""
    body = (await request.body()).decode("utf-8", errors="replace")
    return {name: values[-1] for name, values in urllib.parse.parse_qs(body).items()}


Form = Annotated[dict[str, str], Depends(form_fields)]


class Console:
    """The console's routes for ``app``, reading through ``runtime``'s pools."""

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
        #: Notices are shown only with this process's signature (a link cannot write one).
        self.notices = sign_in.Notices()
        # Forms carry it; a POST without it is refused (cross-site request forgery).
        self.token = secrets.token_urlsafe(32)
        self.pages = jinja2.Environment(
            loader=jinja2.PackageLoader("console.pages", "templates"), autoescape=True, undefined=jinja2.StrictUndefined
        )
        self.pages.filters["age"] = console_data.age
        self.pages.filters["deadline"] = console_data.deadline
        self.pages.filters["when"] = console_data.when
        self.pages.filters["badge"] = console_data.badge
        self.pages.globals["clock_script"] = Markup(console_data.CLOCK_SCRIPT)
        self.pages.filters["pretty"] = lambda value: json.dumps(value, indent=2, sort_keys=True, default=str)
        #: The routes, for ``FastAPI.include_router``.
        self.router = APIRouter(prefix="/console", dependencies=[Depends(self._operator)] if password else [])
        self.router.add_api_route("", self.overview, methods=["GET"], response_class=HTMLResponse)
        self.router.add_api_route("/saga", self.find_saga, methods=["GET"])
        self.router.add_api_route("/sagas", self.saga_list, methods=["GET"], response_class=HTMLResponse)
        self.router.add_api_route("/sagas/{saga_id}", self.saga_page, methods=["GET"], response_class=HTMLResponse)
        self.router.add_api_route("/kinds/{name}", self.kind_page, methods=["GET"], response_class=HTMLResponse)
        self.router.add_api_route("/dead-letters/{service}/{group}", self.letter_group, methods=["GET"])
        self.router.add_api_route("/outbox/failed", self.failed_rows, methods=["GET"], response_class=HTMLResponse)
        self.router.add_api_route("/projections", self.projections_page, methods=["GET"], response_class=HTMLResponse)
        self.router.add_api_route("/events", self.events_page, methods=["GET"], response_class=HTMLResponse)
        self.router.add_api_route("/outbox/scheduled", self.scheduled, methods=["GET"], response_class=HTMLResponse)
        self.router.add_api_route("/charts", self.charts_page, methods=["GET"], response_class=HTMLResponse)
        self.router.add_api_route("/charts/frame", self.charts_frame, methods=["GET"], response_class=HTMLResponse)
        console_schedules.add_routes(self.router, app, runtime, self._page)
        if allow_actions:
            self.router.add_api_route("/outbox/retry", self.retry_rows, methods=["POST"])
            self.router.add_api_route("/dead-letters/replay", self.replay_dead_letters, methods=["POST"])
            self.router.add_api_route("/sagas/{saga_id}/resume", self.resume_saga, methods=["POST"])
            self.router.add_api_route("/sagas/{saga_id}/abort", self.abort_saga, methods=["POST"])

    def _operator(self, request: Request) -> str:
        """The operator's user name, once the request carries the password (HTTP Basic auth); else 401.

        A client that keeps sending wrong passwords is slowed, then locked out (429, see
        :mod:`console.server.sign_in`); a request with no credentials (a browser before its prompt)
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

    def overview(self, notice: str | None = None, sig: str | None = None) -> HTMLResponse:
        """Outboxes, failed rows, dead letters by cause, sagas by status, stuck and failed sagas."""
        overview = console_data.read_overview(self.app, self.runtime)
        projections = console_models.read_projections(self.app, self.runtime)
        scheduled = len(console_models.read_scheduled(self.app, self.runtime))
        liveness, processes = console_liveness.read_processes(self.app, self.runtime)
        return self._page(
            "console.html",
            liveness=liveness,
            processes=processes,
            overview=overview,
            projections=projections,
            scheduled=scheduled,
            scheduled_cap=console_models.SCHEDULED,
            notice=self.notices.verified(notice, sig),
        )

    def find_saga(self, saga_id: str = "") -> Response:
        """The saga page of the id typed into the search box."""
        return RedirectResponse(f"/console/sagas/{urllib.parse.quote(saga_id.strip(), safe='')}", status_code=303)

    def saga_page(self, saga_id: str, notice: str | None = None, sig: str | None = None) -> HTMLResponse:
        """One saga: its state, its timeline, and (with actions allowed) resume and abort."""
        found = self._find(saga_id)
        if found is None:
            return self._page("console_missing.html", reason=f"no saga {saga_id}", status=404)
        where = saga_diagram.position(found.saga, found.row, found.timeline)
        diagram = saga_diagram.render(found.saga, where)
        details = [saga_labels.timeline_detail(found.saga, found.row, entry) for entry in found.timeline]
        notice = self.notices.verified(notice, sig)
        return self._page("console_saga.html", saga=found, notice=notice, diagram=diagram, details=details)

    def saga_list(self, request: Request) -> HTMLResponse:
        """Sagas filtered by kind, status, step, start time and error text, newest first, a page at a time."""
        try:
            query = console_lists.parse_saga_query(self.app, request.query_params)
        except console_lists.BadFilter as exc:
            return self._refuse(str(exc))
        return self.saga_list_html(console_lists.read_saga_list(self.app, self.runtime, query))

    def saga_list_html(self, listed: console_lists.SagaList) -> HTMLResponse:
        """The page of a saga list as read (``bench.console_pages`` draws one of any length)."""
        return self._page("console_sagas.html", listed=listed, statuses=console_lists.STATUSES)

    def kind_page(self, name: str) -> HTMLResponse:
        """A saga kind's diagram, drawn from its declaration, and its counts by status."""
        saga = next((saga for saga in self.app.sagas if saga.name == name), None)
        if saga is None:
            return self._page("console_missing.html", reason=f"no saga kind {name}", status=404)
        return self._page("console_kind.html", saga=saga, diagram=saga_diagram.render(saga))

    def letter_group(self, service: str, group: str) -> HTMLResponse:
        """A dead-letter group: each parked letter's body and reason, and what replays did before."""
        try:
            found = console_lists.read_letter_group(self.app, self.runtime, service, group)
        except console_lists.BadFilter as exc:
            return self._refuse(str(exc))
        if found is None:
            return self._page(
                "console_missing.html", reason=f"no dead letters in group {group} of {service}", status=404
            )
        return self._page("console_letters.html", letters=found)

    def failed_rows(self, service: str = "") -> HTMLResponse:
        """Failed outbox rows with their message, of one service (``?service=``) or all."""
        try:
            rows = console_lists.read_failed_rows(self.app, self.runtime, service or None, console_lists.PAGE * 4)
        except console_lists.BadFilter as exc:
            return self._refuse(str(exc))
        return self._page("console_failed.html", rows=rows, service=service)

    def projections_page(self) -> HTMLResponse:
        """Every projection: position, lag in events and seconds, state, last error; the oldest open writer."""
        return self._page("console_projections.html", found=console_models.read_projections(self.app, self.runtime))

    def events_page(self, request: Request) -> HTMLResponse:
        """A stream's events, as of a time or a version (``estafeta events show``); the streams written last."""
        try:
            query = console_models.parse_stream_query(self.app, request.query_params)
        except console_lists.BadFilter as exc:
            return self._refuse(str(exc))
        found = console_models.read_streams(self.app, self.runtime, query)
        return self._page("console_events.html", found=found, params=request.query_params)

    def scheduled(self) -> HTMLResponse:
        """Messages sent for a time not here yet, soonest first (``estafeta outbox scheduled``)."""
        return self._page("console_scheduled.html", rows=console_models.read_scheduled(self.app, self.runtime))

    def charts_page(self, window: str = "") -> HTMLResponse:
        """The charts over a window, in a frame that redraws itself (a meta refresh: no script)."""
        try:
            minutes = console_charts.parse_window(window)
        except console_charts.BadWindow as exc:
            return self._refuse(str(exc))
        page = self._page("console_charts.html", window=minutes, windows=(15, 60, 180, 720, 1440))
        page.headers.update(_CHARTS_HEADERS)
        return page

    def charts_frame(self, window: str = "") -> HTMLResponse:
        """The charts alone, as the charts page frames them; the frame reloads every few seconds."""
        try:
            minutes = console_charts.parse_window(window)
        except console_charts.BadWindow as exc:
            return self._refuse(str(exc))
        charts = console_charts.read_charts(self.app, self.runtime, minutes)
        drawn = [(chart, console_charts.render(chart)) for chart in charts]
        page = self._page(
            "console_chart_frame.html", charts=drawn, window=minutes, refresh=console_charts.REFRESH_SECONDS
        )
        page.headers.update(_FRAME_HEADERS)
        return page

    def _find(self, saga_id: str) -> console_data.SagaPage | None:
        parsed = _uuid(saga_id)
        return console_data.read_saga(self.app, self.runtime, parsed) if parsed else None

    def _page(self, template: str, *, status: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("notice", None)
        html = self.pages.get_template(template).render(
            app=self.app, allow_actions=self.allow_actions, token=self.token, **context
        )
        return HTMLResponse(html, status_code=status, headers=_HEADERS)

    # -- actions (only routed with --allow-actions) ---------------------------------------

    def retry_rows(self, form: Form) -> Response:
        """Put one failed outbox row (``service`` and ``row_id``) or all of them back to pending, as the CLI does."""
        if self._forged(form):
            return self._refuse(_FORGED, status=403)
        names = [form["service"]] if form.get("service") else self.app.service_names
        if any(name not in self.app.service_names for name in names):
            return self._refuse(f"no service {form['service']!r}")
        if form.get("row_id", "").strip() and not form["row_id"].strip().isdigit():
            return self._refuse(f"row {form['row_id']!r} is not an outbox row id")
        row_id = int(form["row_id"]) if form.get("row_id", "").strip() else None
        total = 0
        for name in names:
            with self.runtime.database(name).connection() as conn:
                total += len(outbox_admin.retry_failed(conn, name, row_id))
        return self._back("/console", f"{total} outbox row(s) back to pending")

    def replay_dead_letters(self, form: Form) -> Response:
        """Replay one group of a service's parked dead letters, as ``estafeta dead-letters replay --group`` does."""
        if self._forged(form):
            return self._refuse(_FORGED, status=403)
        service, group = form.get("service", ""), form.get("group", "")
        if service not in self.app.service_names:
            return self._refuse(f"no service {service!r}")
        done = replay(self.runtime, self.app, [service], group=group)
        if not done:
            return self._refuse(f"no parked dead letters in group {group!r} of {service}", status=404)
        counts: dict[str, int] = {}
        for outcome in done:
            counts[str(outcome.outcome)] = counts.get(str(outcome.outcome), 0) + 1
        # A letter left parked says why, so the operator need not go to the CLI to find out.
        left = [f"#{r.letter.id}: {r.detail}" for r in done if r.outcome in _LEFT_PARKED][:3]
        summary = ", ".join(f"{n} {what}" for what, n in sorted(counts.items()))
        return self._back("/console", "dead letters: " + summary + "".join(f"; {why}" for why in left))

    def resume_saga(self, saga_id: str, form: Form) -> Response:
        """Resume the saga, as ``estafeta sagas resume`` does: its current step is sent again."""
        if self._forged(form):
            return self._refuse(_FORGED, status=403)
        return self._move(saga_id, lambda saga, conn, sid: f"resumed: {saga.resume(conn, sid)}")

    def abort_saga(self, saga_id: str, form: Form) -> Response:
        """Compensate the saga, as ``estafeta sagas abort`` does, recording the operator's reason."""
        if self._forged(form):
            return self._refuse(_FORGED, status=403)
        reason = form.get("reason", "").strip() or "by an operator (console)"

        def abort(saga: Any, conn: Any, sid: uuid.UUID) -> str:
            saga.abort(conn, sid, reason)
            return "aborted: compensating"

        return self._move(saga_id, abort)

    def _move(self, saga_id: str, action: Any) -> Response:
        found = self._find(saga_id)
        if found is None:
            return self._refuse(f"no saga {saga_id}", status=404)
        try:
            with self.runtime.database(found.saga.service).transaction() as conn:
                done = action(found.saga, conn, found.row.saga_id)
        except SagaNotFound as exc:
            return self._refuse(str(exc), status=404)
        except SagaError as exc:
            done = f"refused: {exc}"
        return self._back(f"/console/sagas/{found.row.saga_id}", done)

    def _back(self, path: str, notice: str) -> Response:
        # POST, redirect, GET: reloading the page does not repeat the action. The notice is
        # signed: the page shows no notice a link from elsewhere wrote.
        query = urllib.parse.urlencode({"notice": notice, "sig": self.notices.sign(notice)})
        return RedirectResponse(f"{path}?{query}", status_code=303)

    def _forged(self, form: dict[str, str]) -> bool:
        return not secrets.compare_digest(form.get("token", "").encode(), self.token.encode())

    def _refuse(self, why: str, *, status: int = 400) -> HTMLResponse:
        return self._page("console_missing.html", reason=why, status=status)


def _too_many(why: sign_in.Refusal, wait: float) -> Problem:
    what = "locked out" if why is sign_in.Refusal.LOCKED_OUT else "slowed down"
    return Problem(
        f"too many wrong operator passwords from this address: {what}, try again in {math.ceil(wait)} s",
        status=429,
        title="Too Many Requests",
        headers={"Retry-After": str(math.ceil(wait))},
    )


def _uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None
