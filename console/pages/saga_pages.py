"""The console's saga pages: find a saga, the saga lists, one saga's page, a saga kind's diagram."""

from __future__ import annotations

import urllib.parse
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from .. import saga_diagram, saga_labels
from ..data import lists as console_lists
from ..data import overview as console_data
from .kit import PageKit


class SagaPages:
    """Finding sagas and showing them."""

    def __init__(self, kit: PageKit) -> None:
        self.kit = kit
        self.app = kit.app
        self.runtime = kit.runtime

    def add_routes(self, router: APIRouter) -> None:
        """Route the saga pages on ``router`` (the console's)."""
        router.add_api_route("/saga", self.find_saga, methods=["GET"])
        router.add_api_route("/sagas", self.saga_list, methods=["GET"], response_class=HTMLResponse)
        router.add_api_route("/sagas/{saga_id}", self.saga_page, methods=["GET"], response_class=HTMLResponse)
        router.add_api_route("/kinds/{name}", self.kind_page, methods=["GET"], response_class=HTMLResponse)

    def find_saga(self, saga_id: str = "") -> Response:
        """The saga page of the id typed into the search box."""
        return RedirectResponse(f"/console/sagas/{urllib.parse.quote(saga_id.strip(), safe='')}", status_code=303)

    def saga_page(self, saga_id: str, notice: str | None = None, sig: str | None = None) -> HTMLResponse:
        """One saga: its state, its timeline, and (with actions allowed) resume and abort."""
        found = self.find(saga_id)
        if found is None:
            return self.kit.page("console_missing.html", reason=f"no saga {saga_id}", status=404)
        where = saga_diagram.position(found.saga, found.row, found.timeline)
        diagram = saga_diagram.render(found.saga, where)
        details = [saga_labels.timeline_detail(found.saga, found.row, entry) for entry in found.timeline]
        notice = self.kit.verified(notice, sig)
        return self.kit.page("console_saga.html", saga=found, notice=notice, diagram=diagram, details=details)

    def saga_list(self, request: Request) -> HTMLResponse:
        """Sagas filtered by kind, status, step, start time and error text, newest first, a page at a time."""
        try:
            query = console_lists.parse_saga_query(self.app, request.query_params)
        except console_lists.BadFilter as exc:
            return self.kit.refuse(str(exc))
        return self.saga_list_html(console_lists.read_saga_list(self.app, self.runtime, query))

    def saga_list_html(self, listed: console_lists.SagaList) -> HTMLResponse:
        """The page of a saga list as read (``bench.console_pages`` draws one of any length)."""
        return self.kit.page("console_sagas.html", listed=listed, statuses=console_lists.STATUSES)

    def kind_page(self, name: str) -> HTMLResponse:
        """A saga kind's diagram, drawn from its declaration, and its counts by status."""
        saga = next((saga for saga in self.app.sagas if saga.name == name), None)
        if saga is None:
            return self.kit.page("console_missing.html", reason=f"no saga kind {name}", status=404)
        return self.kit.page("console_kind.html", saga=saga, diagram=saga_diagram.render(saga))

    def find(self, saga_id: str) -> console_data.SagaPage | None:
        """The saga of id ``saga_id`` (``None``: not an id, or no such saga)."""
        parsed = _uuid(saga_id)
        return console_data.read_saga(self.app, self.runtime, parsed) if parsed else None


def _uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None
