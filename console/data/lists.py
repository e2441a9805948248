"""The console's lists: sagas filtered and paged with a keyset cursor, a dead-letter group, failed outbox rows.

A filter comes from the query string and is checked here, once: a bad value is a
:class:`BadFilter` whose message says which parameter and why, in one line (the console
answers it with a 400).
"""

from __future__ import annotations

import urllib.parse
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import attrs

from estafeta import App, Runtime, Saga, SagaStep
from estafeta.operations.dead_letter_causes import cause_of
from estafeta.operations.dead_letters import DeadLetter, groups
from estafeta_sql import dead_letters, outbox_admin, saga_reports, sagas

#: Sagas on one page of a list.
PAGE = 50
#: The longest step name or error text a filter takes.
_LONGEST = 200
#: Dead letters of every status read to build a group's history.
HISTORY = 1000
STATUSES = sagas.STATUSES


class BadFilter(ValueError):
    """A list's query string has a value the console cannot use."""


@attrs.frozen
class SagaQuery:
    """A saga list as asked for: a kind (``None``: every kind) and the filter."""

    kind: str | None
    where: saga_reports.ListFilter

    def link(self, **changes: Any) -> str:
        """This list's URL, with ``changes`` (``after=...``) applied."""
        fields = {
            "kind": self.kind,
            "status": self.where.status,
            "step": self.where.step,
            "since": self.where.since.isoformat() if self.where.since else None,
            "until": self.where.until.isoformat() if self.where.until else None,
            "error": self.where.error,
            "stuck": "yes" if self.where.stuck else None,
            **changes,
        }
        query = urllib.parse.urlencode({name: value for name, value in fields.items() if value})
        return "/console/sagas" + (f"?{query}" if query else "")


@attrs.frozen
class SagaListLine:
    """One saga in a list: its kind and its row."""

    kind: str
    row: sagas.SagaRow


@attrs.frozen
class SagaList:
    """One page of a saga list, and the link to the next page when there is one."""

    query: SagaQuery
    lines: list[SagaListLine]
    next_page: str | None


def parse_saga_query(app: App, params: Mapping[str, str]) -> SagaQuery:
    """The list the query string ``params`` asks for; :class:`BadFilter` saying what is wrong otherwise."""
    kinds = {saga.name: saga for saga in app.sagas}
    kind = params.get("kind") or None
    if kind is not None and kind not in kinds:
        raise BadFilter(f"kind: no saga kind {kind!r} (this app has: {', '.join(kinds) or 'none'})")
    status = params.get("status") or None
    if status is not None and status not in STATUSES:
        raise BadFilter(f"status: {status!r} is not one of {', '.join(STATUSES)}")
    step = _text(params, "step")
    steps = {s.name for saga in ([kinds[kind]] if kind else kinds.values()) for s in _steps(saga)}
    if step is not None and step not in steps:
        raise BadFilter(f"step: no step {step!r} in {'the ' + kind + ' saga' if kind else 'any saga kind'}")
    since, until = _time(params, "since"), _time(params, "until")
    if since and until and since >= until:
        raise BadFilter("since: must be before until")
    stuck = params.get("stuck", "").strip().lower()
    if stuck not in ("", "yes", "on", "true", "1"):
        raise BadFilter(f"stuck: {stuck[:20]!r} is not yes (or leave it out)")
    where = saga_reports.ListFilter(
        status, step, since, until, _text(params, "error"), _cursor(params.get("after")), stuck=bool(stuck) or None
    )
    return SagaQuery(kind, where)


def _steps(saga: Saga) -> list[SagaStep]:
    """Every step a saga of this kind may stand on: its steps and those after compensation."""
    return [*saga.steps, *saga.after_compensation]


def _text(params: Mapping[str, str], name: str) -> str | None:
    value = params.get(name, "").strip()
    if len(value) > _LONGEST:
        raise BadFilter(f"{name}: longer than {_LONGEST} characters")
    return value or None


def _time(params: Mapping[str, str], name: str) -> datetime | None:
    value = params.get(name, "").strip()
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise BadFilter(
            f"{name}: {value[:40]!r} is not a time (ISO 8601: 2026-12-01T09:30, UTC unless it says)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _cursor(value: str | None) -> tuple[datetime, uuid.UUID] | None:
    if not value:
        return None
    moment, _, saga_id = value.rpartition(",")
    try:
        parsed = (datetime.fromisoformat(moment), uuid.UUID(saga_id))
    except ValueError:
        raise BadFilter("after: not a cursor of this console (follow the list's 'next page' link)") from None
    if parsed[0].tzinfo is None:
        raise BadFilter("after: not a cursor of this console (follow the list's 'next page' link)")
    return parsed


def read_saga_list(app: App, runtime: Runtime, query: SagaQuery, page: int = PAGE) -> SagaList:
    """One page of ``query``'s sagas, newest first, across the kinds it asks for.

    Each kind's table gives its newest ``page + 1`` past the cursor (an index walk, see
    ``sql/migrations/_saga/0002_list_indexes.sql``); the merge keeps the newest ``page``.
    """
    found: list[SagaListLine] = []
    for saga in _kinds(app, query):
        with runtime.database(saga.service).connection() as conn:
            found += [
                SagaListLine(saga.name, row) for row in saga_reports.list_page(conn, saga.table, query.where, page + 1)
            ]
    found.sort(key=lambda line: (line.row.started_at, line.row.saga_id), reverse=True)
    lines = found[:page]
    next_page = None
    if len(found) > page:
        last = lines[-1].row
        next_page = query.link(after=f"{last.started_at.isoformat()},{last.saga_id}")
    return SagaList(query, lines, next_page)


def _kinds(app: App, query: SagaQuery) -> list[Saga]:
    step = query.where.step
    return [
        saga
        for saga in app.sagas
        if (query.kind is None or saga.name == query.kind)
        and (step is None or any(s.name == step for s in _steps(saga)))
    ]


@attrs.frozen
class LetterGroup:
    """A dead-letter group: a page of its letters parked now, and those of the same cause resolved before."""

    service: str
    group: str
    #: One page of the parked letters, newest first.
    parked: list[DeadLetter]
    #: Every parked letter of the group, counted.
    parked_count: int
    #: Replayed or obsolete letters of this cause, newest first: what replays did before.
    history: list[DeadLetter]
    #: The link to the next page of parked letters, if there is one.
    next_page: str | None = None
    #: Whether this is the first page.
    first: bool = True


def read_letter_group(
    app: App, runtime: Runtime, service: str, group: str, before: str | None = None, page: int = PAGE
) -> LetterGroup | None:
    """A page of the parked letters of ``group`` in ``service`` (``None`` when it has none at all).

    The newest ``page`` parked letters with an id below ``before`` (as ``estafeta dead-letters
    groups`` counts them: bodies are read for that page only), and the group's history among the
    newest ``HISTORY`` letters of the service (its newest ``page`` shown).
    """
    if service not in app.service_names:
        raise BadFilter(f"service: no service {service!r}")
    if before is not None and not before.isdigit():
        raise BadFilter("before: not a letter id (follow the page's 'next page' link)")
    ids = sorted((i for found in groups(runtime, [service]) if found.group == group for i in found.ids), reverse=True)
    shown = [i for i in ids if before is None or i < int(before)][:page]
    with runtime.database(service).connection() as conn:
        parked = dead_letters.get_many(conn, service, shown) if shown else []
        recent = dead_letters.search(conn, service, status=None, limit=HISTORY)
    history = [row for row in recent if row.status != "parked" and cause_of(row.consumer, row.reason).group == group]
    if not ids and not history:
        return None
    more = bool(shown) and shown[-1] > ids[-1]
    base = f"/console/dead-letters/{urllib.parse.quote(service, safe='')}/{urllib.parse.quote(group, safe='')}"
    return LetterGroup(
        service,
        group,
        sorted((DeadLetter.of(service, row) for row in parked), key=lambda letter: letter.id, reverse=True),
        len(ids),
        [DeadLetter.of(service, row) for row in history[:page]],
        next_page=f"{base}?before={shown[-1]}" if more else None,
        first=before is None,
    )


def read_failed_rows(app: App, runtime: Runtime, service: str | None, limit: int) -> list[dict[str, Any]]:
    """Failed outbox rows with their message, of one service or all."""
    if service is not None and service not in app.service_names:
        raise BadFilter(f"service: no service {service!r}")
    found = []
    for name in [service] if service else app.service_names:
        with runtime.database(name).connection() as conn:
            found += [{"service": name, **row} for row in outbox_admin.list_failed(conn, name, limit)]
    return found
