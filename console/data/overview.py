"""What the operator console shows, read from every service's database of an app."""

from __future__ import annotations

import base64
import hashlib
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
from markupsafe import Markup, escape

from estafeta import App, Runtime, Saga
from estafeta.operations.dead_letters import Group, groups
from estafeta_sql import outbox_admin, saga_reports
from estafeta_sql.outbox_admin import OutboxStats
from estafeta_sql.sagas import GAVE_UP, LogEntry, SagaRow

#: Rows shown per list (the CLI pages further: ``estafeta outbox failed --limit``...).
LIMIT = 50


@attrs.frozen
class SagaKind:
    """One saga kind's counts by status."""

    saga: Saga
    counts: dict[str, int]


@attrs.frozen
class SagaLine:
    """A saga in a list: its kind and its row."""

    kind: str
    row: SagaRow


@attrs.frozen
class Overview:
    """The console's front page."""

    #: Each service's outbox: (service, what waits in it).
    outboxes: list[tuple[str, OutboxStats]]
    #: Outbox rows out of publish attempts, each with its ``service``.
    failed_rows: list[dict[str, Any]]
    #: Parked dead letters grouped by cause (the groups ``estafeta dead-letters`` shows), most first.
    dead_letters: list[Group]
    sagas: list[SagaKind]
    #: Live sagas past their deadline (nobody answered; the watchdog or an operator must act).
    stuck: list[SagaLine]
    #: Sagas an operator must look at (``last_error`` says why): failed, then given up (not final).
    failed: list[SagaLine]


@attrs.frozen
class SagaPage:
    """One saga, its kind and its timeline."""

    saga: Saga
    row: SagaRow
    timeline: list[LogEntry]

    @property
    def can_abort(self) -> bool:
        """Whether ``Saga.abort`` would accept it (running, or failed before compensating, before its pivot)."""
        step = next((s for s in self.saga.steps if s.name == self.row.current_step), None)
        retriable = step is not None and step.retriable
        return self.row.status in ("running", "failed") and self.row.compensations is None and not retriable

    @property
    def can_resume(self) -> bool:
        """Whether ``Saga.resume`` would accept it (live, failed, or given up)."""
        return self.row.live or self.row.status in ("failed", GAVE_UP)


def read_overview(app: App, runtime: Runtime) -> Overview:
    """Everything the front page shows, one service database at a time."""
    outboxes, failed_rows, dead_letters = [], [], []
    for name in app.service_names:
        with runtime.database(name).connection() as conn:
            outboxes.append((name, outbox_admin.stats(conn, name)))
            failed_rows += [{"service": name, **row} for row in outbox_admin.list_failed(conn, name, LIMIT)]
    kinds, stuck, failed = [], [], []
    for saga in app.sagas:
        with runtime.database(saga.service).connection() as conn:
            kinds.append(SagaKind(saga, saga_reports.count_by_status(conn, saga.table)))
            stuck += [
                SagaLine(saga.name, r)
                for r in saga_reports.search(conn, saga.table, status=None, stuck=True, limit=LIMIT)
            ]
            failed += [
                SagaLine(saga.name, r)
                for status in ("failed", GAVE_UP)
                for r in saga_reports.search(conn, saga.table, status=status, stuck=False, limit=LIMIT)
            ]
    dead_letters = sorted(groups(runtime, app.service_names), key=lambda g: (-g.count, g.service))[:LIMIT]
    return Overview(outboxes, failed_rows, dead_letters, kinds, stuck, failed)


def read_saga(app: App, runtime: Runtime, saga_id: uuid.UUID) -> SagaPage | None:
    """The saga ``saga_id``, whichever kind of ``app`` it is."""
    for saga in app.sagas:
        with runtime.database(saga.service).connection() as conn:
            row = saga.get(conn, saga_id)
            if row is not None:
                return SagaPage(saga, row, saga.timeline(conn, saga_id))
    return None


def past_deadline(row: SagaRow) -> bool:
    """Whether ``row``'s saga still waits and its deadline has passed (the watchdog or an operator must act)."""
    return row.live and row.deadline_at is not None and row.deadline_at <= datetime.now(UTC)


def age(value: datetime | float | None) -> str:
    """How long ago ``value`` was (or a number of seconds), for people: ``4.2 s``, ``12 min``, ``3 h``."""
    if value is None:
        return "—"
    seconds = value if isinstance(value, int | float) else (datetime.now(UTC) - value).total_seconds()
    if abs(seconds) < 60:
        return f"{seconds:.1f} s"
    if abs(seconds) < 3600:
        return f"{seconds / 60:.0f} min"
    if abs(seconds) < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{timedelta(seconds=seconds).days} d"


def deadline(value: datetime | None) -> str:
    """A deadline for people: ``passed 3 min ago``, ``in 25.0 s``, or ``—`` (none: the saga has ended)."""
    if value is None:
        return "—"
    seconds = (datetime.now(UTC) - value).total_seconds()
    return f"passed {age(seconds)} ago" if seconds >= 0 else f"in {age(-seconds)}"


#: Turns every ``<time datetime>`` into the reader's local time and its age ("3 min ago"),
#: and keeps the ages current. Inline and fixed: the pages allow this script by its hash
#: (``SCRIPT_HASH``), and nothing else; without it each time reads in UTC, aged by the server.
CLOCK_SCRIPT = """
(function () {
  var ago = new Intl.RelativeTimeFormat(undefined, {numeric: "auto"});
  var spans = [[60, "second"], [60, "minute"], [24, "hour"], [7, "day"], [4.35, "week"], [12, "month"]];
  function age(date) {
    var amount = (date.getTime() - Date.now()) / 1000;
    for (var i = 0; i < spans.length; i++) {
      if (Math.abs(amount) < spans[i][0]) { return ago.format(Math.round(amount), spans[i][1]); }
      amount /= spans[i][0];
    }
    return ago.format(Math.round(amount), "year");
  }
  function draw() {
    document.querySelectorAll("time[datetime]").forEach(function (node) {
      var date = new Date(node.getAttribute("datetime"));
      if (isNaN(date)) { return; }
      var local = date.toLocaleString(undefined, {dateStyle: "medium", timeStyle: "medium"});
      node.textContent = node.classList.contains("age-only") ? age(date) : local + " \\u00b7 " + age(date);
      node.dataset.local = "yes";
    });
  }
  draw();
  setInterval(draw, 15000);
})();
"""
#: The CSP source that allows :data:`CLOCK_SCRIPT` and no other script.
SCRIPT_HASH = "'sha256-" + base64.b64encode(hashlib.sha256(CLOCK_SCRIPT.encode()).digest()).decode() + "'"

#: Colours of statuses and states, by what they mean to an operator.
_TONES = {
    "running": "live",
    "compensating": "warn",
    "rebuilding": "warn",
    "retrying": "warn",
    "pending": "live",
    "completed": "ok",
    "replayed": "ok",
    "compensated": "muted",
    "stopped": "muted",
    "not started": "muted",
    "discarded": "muted",
    "failed": "bad",
    "gave_up": "warn",
    "parked": "bad",
    "past deadline": "bad",
}


def when(value: datetime | None, *, age_only: bool = False) -> Markup:
    """A time as ``<time datetime>``: in UTC with its age from the server, in local time once the script runs."""
    if value is None:
        return Markup("—")
    utc = value.astimezone(UTC)
    seconds = (datetime.now(UTC) - utc).total_seconds()
    aged = f"{age(seconds)} ago" if seconds >= 0 else f"in {age(-seconds)}"
    text = aged if age_only else f"{utc:%Y-%m-%d %H:%M:%S} UTC · {aged}"
    klass = ' class="age-only"' if age_only else ""
    # An f-string over escaped parts: Markup.format costs ten times more, on every row of a list.
    return Markup(f'<time datetime="{utc.isoformat()}" title="{utc:%Y-%m-%d %H:%M:%S} UTC"{klass}>{text}</time>')


def badge(status: str | None) -> Markup:
    """A status as a coloured badge (its words unchanged: tests and people read the same text)."""
    if not status:
        return Markup("")
    return Markup(f'<span class="badge {_TONES.get(status, "muted")}">{escape(status)}</span>')
