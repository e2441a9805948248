"""The console's actions (routed only with ``estafeta serve --allow-actions``): retry, replay, resume, abort.

Each is a POST form carrying the console's token, answered by a redirect to a page showing
a signed notice of what was done (POST, redirect, GET: a reload repeats nothing). Each calls
what the CLI calls: ``estafeta outbox retry``, ``estafeta dead-letters replay``,
``estafeta sagas resume`` and ``estafeta sagas abort``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter
from fastapi.responses import Response

from estafeta import SagaError, SagaNotFound
from estafeta.operations.dead_letter_replay import ReplayOutcome, replay
from estafeta.operations.dead_letters import groups
from estafeta_sql import outbox_admin

from .kit import FORGED, Form, PageKit
from .saga_pages import SagaPages

#: Replay outcomes that leave a letter parked: the console's notice gives their reasons.
_LEFT_PARKED = (ReplayOutcome.SKIPPED, ReplayOutcome.FAILED)


class Actions:
    """The console's POST actions."""

    def __init__(self, kit: PageKit, sagas: SagaPages) -> None:
        self.kit = kit
        self.app = kit.app
        self.runtime = kit.runtime
        self.sagas = sagas

    def add_routes(self, router: APIRouter) -> None:
        """Route the actions on ``router`` (the console's)."""
        router.add_api_route("/outbox/retry", self.retry_rows, methods=["POST"])
        router.add_api_route("/dead-letters/replay", self.replay_dead_letters, methods=["POST"])
        router.add_api_route("/sagas/{saga_id}/resume", self.resume_saga, methods=["POST"])
        router.add_api_route("/sagas/{saga_id}/abort", self.abort_saga, methods=["POST"])

    def retry_rows(self, form: Form) -> Response:
        """Put one failed outbox row (``service`` and ``row_id``) or all of them back to pending, as the CLI does."""
        if self.kit.forged(form):
            return self.kit.refuse(FORGED, status=403)
        names = [form["service"]] if form.get("service") else self.app.service_names
        if any(name not in self.app.service_names for name in names):
            return self.kit.refuse(f"no service {form['service']!r}")
        if form.get("row_id", "").strip() and not form["row_id"].strip().isdigit():
            return self.kit.refuse(f"row {form['row_id']!r} is not an outbox row id")
        row_id = int(form["row_id"]) if form.get("row_id", "").strip() else None
        total = 0
        for name in names:
            with self.runtime.database(name).connection() as conn:
                total += len(outbox_admin.retry_failed(conn, name, row_id))
        return self.kit.back("/console", f"{total} outbox row(s) back to pending")

    def replay_dead_letters(self, form: Form) -> Response:
        """Replay the group's parked letters once the operator confirmed their count (after its dry run).

        As ``estafeta dead-letters replay --group`` does, for the letters parked now; if the
        group no longer holds the count confirmed (letters came or went since the dry run),
        nothing is replayed and the operator is sent back to look again.
        """
        if self.kit.forged(form):
            return self.kit.refuse(FORGED, status=403)
        service, group = form.get("service", ""), form.get("group", "")
        if service not in self.app.service_names:
            return self.kit.refuse(f"no service {service!r}")
        ids = [i for found in groups(self.runtime, [service]) if found.group == group for i in found.ids]
        if not ids:
            return self.kit.refuse(f"no parked dead letters in group {group!r} of {service}", status=404)
        if form.get("count", "").strip() != str(len(ids)):
            preview = f"/console/dead-letters/{quote(service, safe='')}/{quote(group, safe='')}/replay"
            return self.kit.back(
                preview,
                f"the group holds {len(ids)} parked letters now, not the {form.get('count')}"
                " confirmed: nothing was replayed; look again",
            )
        done = replay(self.runtime, self.app, [service], ids=ids)
        counts: dict[str, int] = {}
        for outcome in done:
            counts[str(outcome.outcome)] = counts.get(str(outcome.outcome), 0) + 1
        # A letter left parked says why, so the operator need not go to the CLI to find out.
        left = [f"#{r.letter.id}: {r.detail}" for r in done if r.outcome in _LEFT_PARKED][:3]
        summary = ", ".join(f"{n} {what}" for what, n in sorted(counts.items()))
        return self.kit.back("/console", "dead letters: " + summary + "".join(f"; {why}" for why in left))

    def resume_saga(self, saga_id: str, form: Form) -> Response:
        """Resume the saga, as ``estafeta sagas resume`` does: its current step is sent again."""
        if self.kit.forged(form):
            return self.kit.refuse(FORGED, status=403)
        return self._move(saga_id, lambda saga, conn, sid: f"resumed: {saga.resume(conn, sid)}")

    def abort_saga(self, saga_id: str, form: Form) -> Response:
        """Compensate the saga, as ``estafeta sagas abort`` does, recording the operator's reason."""
        if self.kit.forged(form):
            return self.kit.refuse(FORGED, status=403)
        reason = form.get("reason", "").strip() or "by an operator (console)"

        def abort(saga: Any, conn: Any, sid: uuid.UUID) -> str:
            saga.abort(conn, sid, reason)
            return "aborted: compensating"

        return self._move(saga_id, abort)

    def _move(self, saga_id: str, action: Callable[[Any, Any, uuid.UUID], str]) -> Response:
        found = self.sagas.find(saga_id)
        if found is None:
            return self.kit.refuse(f"no saga {saga_id}", status=404)
        try:
            with self.runtime.database(found.saga.service).transaction() as conn:
                done = action(found.saga, conn, found.row.saga_id)
        except SagaNotFound as exc:
            return self.kit.refuse(str(exc), status=404)
        except SagaError as exc:
            done = f"refused: {exc}"
        return self.kit.back(f"/console/sagas/{found.row.saga_id}", done)
