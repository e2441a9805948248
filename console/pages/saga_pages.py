"""The console's saga pages: find a saga, the saga lists, one saga's page, a saga kind's diagram."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from estafeta_sql import saga_lookup, saga_reports

from .. import saga_diagram, saga_labels
from ..data import finding
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
        """What the search box found: the saga's page if one saga matches, a list to choose from if several.

        The box takes a saga id, a business key (an order id) or the first characters of either
        (:func:`estafeta_console.data.finding.find_sagas`).
        """
        try:
            found = finding.find_sagas(self.app, self.runtime, saga_id)
        except finding.NotSearchable as exc:
            return self.kit.refuse(str(exc))
        if len(found) == 1:
            return RedirectResponse(f"/console/sagas/{found[0].row.saga_id}", status_code=303)
        if not found:
            keys = sorted({saga.key for saga in self.app.sagas})
            why = f"no saga has {saga_id.strip()!r} as its id, its {' or '.join(keys) or 'key'}, or their start"
            return self.kit.refuse(why, status=404)
        return self.kit.page("console_found.html", found=found, typed=saga_id.strip(), most=finding.MOST)

    def saga_page(self, saga_id: str, notice: str | None = None, sig: str | None = None) -> HTMLResponse:
        """One saga: its state, its timeline, and (with actions allowed) resume and abort."""
        found = self.find(saga_id)
        if found is None:
            return self.kit.page("console_missing.html", reason=f"no saga {saga_id}", status=404)
        where = saga_diagram.position(found.saga, found.row, found.timeline)
        diagram = saga_diagram.render(found.saga, where)
        details = [saga_labels.timeline_detail(found.saga, found.row, entry) for entry in found.timeline]
        steps = saga_labels.transition_steps(found.saga, found.timeline)
        notice = self.kit.verified(notice, sig)
        return self.kit.page(
            "console_saga.html", saga=found, notice=notice, diagram=diagram, details=details, steps=steps, where=where
        )

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
        with self.runtime.database(saga.service).connection() as conn:
            standing = saga_diagram.standing(saga, saga_lookup.standing_by_step(conn, saga.table))
            ended = saga_reports.count_by_status(conn, saga.table)
        standing.update({f"end:{status}": ended.get(status, 0) for status in ("completed", "compensated")})
        diagram = saga_diagram.render(saga, counts=standing)
        return self.kit.page("console_kind.html", saga=saga, diagram=diagram, standing=standing)

    def find(self, saga_id: str) -> console_data.SagaPage | None:
        """The saga of id ``saga_id`` (``None``: not an id, or no such saga)."""
        parsed = _uuid(saga_id)
        return console_data.read_saga(self.app, self.runtime, parsed) if parsed else None


def _uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None
