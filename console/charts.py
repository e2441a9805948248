"""The console's charts: sagas, outbox backlog and dead letters over a window, drawn as SVG on the server.

Read from the tables the console already reads, and only from them, so each chart shows
what those tables still hold, no more:

- **Sagas per minute**: started (``started_at``), and completed or compensated (their
  ``completed_at``), summed over every saga kind. Exact, except for sagas a retention
  job has deleted. The ended ones are found through a partial index on ``completed_at``
  (``sql/migrations/_saga/0003_ended_index.sql``).
- **Outbox backlog and oldest wait per service**: a row is deleted once the broker
  confirmed it, so the past backlog cannot be read back. What is drawn is a *lower
  bound*: at each minute, the rows written by then that are still in the outbox now
  (pending or failed), and how long the oldest of them had waited then. A backlog that
  drained shows as nothing; the last point is exact.
- **Dead letters per group per minute**: every dead letter written in the window (parked,
  replayed or obsolete: it failed then, whatever became of it), by the cause
  ``estafeta dead-letters groups`` groups them by; the six largest groups, the rest as
  ``other``. ``dead_letters.created_at`` has no index: a scan of the table, kept small by
  retention.

Every label (service names, error text in a group's cause) is escaped here.
"""

from __future__ import annotations

import html
import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
from markupsafe import Markup
from psycopg import sql

from estafeta import App, Runtime
from estafeta.operations.dead_letter_causes import cause_of

#: The window when none is asked for, and the bounds of one that is (minutes).
DEFAULT_WINDOW, MIN_WINDOW, MAX_WINDOW = 60, 5, 24 * 60
#: At most this many buckets: a longer window gets buckets of several minutes.
MAX_BUCKETS = 60
#: Dead-letter groups drawn on their own; the rest are summed as ``other``.
MAX_GROUPS = 6
#: Seconds between redraws of the charts' frame.
REFRESH_SECONDS = 10
WIDTH, HEIGHT = 860, 220
PLOT_LEFT, PLOT_RIGHT, PLOT_TOP, PLOT_BOTTOM = 48, 250, 28, 34
COLOURS = ("#1f6feb", "#2e7d32", "#c62828", "#8a5a00", "#6a1b9a", "#00838f", "#555")
_WINDOW = re.compile(r"^([0-9]{1,5})\s*(m|min|h)?$")


class BadWindow(ValueError):
    """A ``window`` the charts cannot draw; the message is the one line the operator sees."""


def parse_window(text: str | None) -> int:
    """Minutes of ``?window=``: ``90``, ``90m``, ``3h``; 60 when absent; 5 min to 24 h."""
    if text is None or not text.strip():
        return DEFAULT_WINDOW
    matched = _WINDOW.match(text.strip().lower())
    if matched is None:
        raise BadWindow(f"window={text[:40]!r}: not a number of minutes (90, 90m) or hours (3h)")
    minutes = int(matched[1]) * (60 if matched[2] == "h" else 1)
    if not MIN_WINDOW <= minutes <= MAX_WINDOW:
        raise BadWindow(f"window={text[:40]!r}: must be between {MIN_WINDOW} min and {MAX_WINDOW // 60} h")
    return minutes


@attrs.frozen
class Axis:
    """The buckets of a chart: ``count`` buckets of ``minutes`` each from ``start``."""

    start: datetime
    minutes: int
    count: int

    @classmethod
    def ending(cls, now: datetime, window: int) -> Axis:
        """Buckets covering ``window`` minutes up to the end of the minute ``now`` is in."""
        minutes = max(1, math.ceil(window / MAX_BUCKETS))
        count = math.ceil(window / minutes)
        end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
        return cls(end - timedelta(minutes=minutes * count), minutes, count)

    @property
    def end(self) -> datetime:
        """Where the last bucket ends."""
        return self.at(self.count)

    def at(self, index: int) -> datetime:
        """Where bucket ``index`` starts."""
        return self.start + timedelta(minutes=self.minutes * index)

    def index(self, when: datetime) -> int | None:
        """The bucket ``when`` falls in, or ``None`` outside the window."""
        if when < self.start or when >= self.end:
            return None
        return int((when - self.start).total_seconds() // (self.minutes * 60))


@attrs.frozen
class Series:
    """One line of a chart: a value per bucket."""

    name: str
    values: list[float]


@attrs.frozen
class Chart:
    """A chart's title, unit, buckets and lines."""

    id: str
    title: str
    unit: str
    axis: Axis
    series: list[Series]
    #: What the chart cannot show, under its title.
    caveat: str = ""


def read_charts(app: App, runtime: Runtime, window: int, now: datetime | None = None) -> list[Chart]:
    """The console's four charts over the ``window`` minutes up to ``now`` (the database's clock)."""
    if now is None:
        with runtime.database(app.service_names[0]).connection() as conn:
            (now,) = _one(conn, sql.SQL("SELECT now()"), ())
    assert now is not None
    axis = Axis.ending(now, window)
    return [
        _saga_chart(app, runtime, axis),
        *_outbox_charts(app, runtime, axis),
        _letters_chart(app, runtime, axis),
    ]


def _one(conn: Any, statement: sql.Composable, params: tuple[Any, ...]) -> tuple[Any, ...]:
    row = conn.execute(statement, params).fetchone()
    assert row is not None  # an aggregate always answers a row
    return tuple(row)


def bucket_query(table: sql.Identifier, column: str, *, extra: str = "", where: str = "TRUE") -> sql.Composed:
    """Counts of the rows of ``table`` whose ``column`` is in the window, per bucket (and ``extra`` columns)."""
    return sql.SQL(
        "SELECT floor(extract(epoch FROM {col} - %(start)s) / %(seconds)s)::int AS bucket{extra}, count(*)"
        " FROM {table} WHERE {col} >= %(start)s AND {col} < %(end)s AND ({where}) GROUP BY bucket{extra}"
    ).format(
        extra=sql.SQL(extra),
        table=table,
        col=sql.Identifier(column),
        where=sql.SQL(where),  # a constant of this module, never the request's text
    )


def bucket_params(axis: Axis) -> dict[str, Any]:
    """The parameters of a :func:`bucket_query` over ``axis``."""
    return {"start": axis.start, "end": axis.end, "seconds": axis.minutes * 60}


#: The sagas that ended so (``sql/migrations/_saga/0003_ended_index.sql`` indexes them).
ENDED = "status IN ('completed', 'compensated')"


def _buckets(
    conn: Any, table: sql.Identifier, column: str, axis: Axis, *, extra: str = "", where: str = "TRUE"
) -> list[tuple[Any, ...]]:
    statement = bucket_query(table, column, extra=extra, where=where)
    return [tuple(row) for row in conn.execute(statement, bucket_params(axis)).fetchall()]


def _saga_chart(app: App, runtime: Runtime, axis: Axis) -> Chart:
    counts = {name: [0.0] * axis.count for name in ("started", "completed", "compensated")}
    for saga in app.sagas:
        table = sql.Identifier(saga.table.schema, saga.table.table)
        with runtime.database(saga.service).connection() as conn:
            for bucket, count in _buckets(conn, table, "started_at", axis):
                _add(counts["started"], bucket, count)
            ended = _buckets(conn, table, "completed_at", axis, extra=", status", where=ENDED)
            for bucket, status, count in ended:
                _add(counts[status], bucket, count)
    return Chart(
        "sagas",
        "Sagas started, completed and compensated",
        f"per {_per(axis)}",
        axis,
        [Series(name, values) for name, values in counts.items()],
        "every saga kind summed; sagas deleted by retention are not counted",
    )


def _outbox_charts(app: App, runtime: Runtime, axis: Axis) -> list[Chart]:
    backlog, oldest = [], []
    for service in app.service_names:
        table = sql.Identifier(service, "outbox")
        with runtime.database(service).connection() as conn:
            before, first = _one(
                conn,
                sql.SQL("SELECT count(*) FILTER (WHERE created_at < %s), min(created_at) FROM {}").format(table),
                (axis.start,),
            )
            written = [0.0] * axis.count
            for bucket, count in _buckets(conn, table, "created_at", axis):
                _add(written, bucket, count)
        counts, waits, total = [], [], float(before)
        for i, count in enumerate(written):
            total += count
            end = axis.at(i + 1)
            counts.append(total)
            waits.append((end - first).total_seconds() / 60 if total and first is not None and first < end else 0.0)
        backlog.append(Series(service, counts))
        oldest.append(Series(service, waits))
    caveat = "a lower bound: published rows are deleted, so only rows still in the outbox now are counted"
    return [
        Chart("outbox-backlog", "Outbox backlog per service", "rows", axis, backlog, caveat),
        Chart("outbox-oldest", "Oldest wait in the outbox per service", "minutes", axis, oldest, caveat),
    ]


def _letters_chart(app: App, runtime: Runtime, axis: Axis) -> Chart:
    counts: dict[str, list[float]] = {}
    for service in app.service_names:
        with runtime.database(service).connection() as conn:
            rows = conn.execute(
                sql.SQL(
                    "SELECT consumer, reason, created_at FROM {} WHERE created_at >= %s AND created_at < %s"
                ).format(sql.Identifier(service, "dead_letters")),
                (axis.start, axis.end),
            ).fetchall()
        for consumer, reason, when in rows:
            cause = cause_of(consumer, reason)
            name = f"{cause.actor} {cause.error}: {cause.pattern}"
            _add(counts.setdefault(name, [0.0] * axis.count), axis.index(when))
    ranked = sorted(counts.items(), key=lambda item: (-sum(item[1]), item[0]))
    series = [Series(name, values) for name, values in ranked[:MAX_GROUPS]]
    if len(ranked) > MAX_GROUPS:
        rest = [sum(values[i] for _, values in ranked[MAX_GROUPS:]) for i in range(axis.count)]
        series.append(Series(f"other ({len(ranked) - MAX_GROUPS} groups)", rest))
    return Chart(
        "dead-letters",
        "Dead letters per group",
        f"per {_per(axis)}",
        axis,
        series,
        "every letter written in the window, whether still parked, replayed or obsolete",
    )


def _add(values: list[float], index: int | None, count: int = 1) -> None:
    if index is not None and 0 <= index < len(values):
        values[index] += count


def _per(axis: Axis) -> str:
    return "minute" if axis.minutes == 1 else f"{axis.minutes} minutes"


def render(chart: Chart) -> Markup:
    """``chart`` as an SVG element: a line and a point per bucket for each series, axes, a legend."""
    e = html.escape
    plot_w, plot_h = WIDTH - PLOT_LEFT - PLOT_RIGHT, HEIGHT - PLOT_TOP - PLOT_BOTTOM
    top = max((max(s.values, default=0.0) for s in chart.series), default=0.0)
    scale = _nice(top)
    step = plot_w / max(1, chart.axis.count - 1)

    def x(i: int) -> float:
        return PLOT_LEFT + i * step

    def y(value: float) -> float:
        return PLOT_TOP + plot_h - value / scale * plot_h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" id="chart-{e(chart.id)}" '
        f'width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{e(chart.title)}">',
        f'<text class="title" x="{PLOT_LEFT}" y="16">{e(chart.title)}</text>',
        f'<text class="unit" x="{PLOT_LEFT + plot_w}" y="16" text-anchor="end">{e(chart.unit)}</text>',
        '<g class="axis y">',
    ]
    for fraction in (0, 0.5, 1):
        value = scale * fraction
        out.append(
            f'<line x1="{PLOT_LEFT}" x2="{PLOT_LEFT + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}"/>'
            f'<text x="{PLOT_LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{_number(value)}</text>'
        )
    out.append('</g><g class="axis x">')
    ticks = sorted({0, chart.axis.count - 1, *range(0, chart.axis.count, max(1, chart.axis.count // 6))})
    for i in ticks:
        label = chart.axis.at(i).astimezone(UTC).strftime("%H:%M")
        out.append(f'<text x="{x(i):.1f}" y="{HEIGHT - PLOT_BOTTOM + 16}" text-anchor="middle">{label}</text>')
    out.append(f'<text x="{PLOT_LEFT + plot_w}" y="{HEIGHT - 4}" text-anchor="end">UTC</text></g>')
    if not chart.series or top == 0:
        out.append(f'<text class="empty" x="{PLOT_LEFT + plot_w / 2:.1f}" y="{PLOT_TOP + plot_h / 2:.1f}" ')
        out.append('text-anchor="middle">nothing in this window</text>')
    for n, series in enumerate(chart.series):
        colour = COLOURS[n % len(COLOURS)]
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(series.values))
        out.append(f'<g class="series" data-series="{e(series.name)}" stroke="{colour}" fill="{colour}">')
        out.append(f'<polyline fill="none" points="{points}"/>')
        for i, value in enumerate(series.values):
            if value:
                when = chart.axis.at(i).astimezone(UTC).strftime("%H:%M")
                out.append(
                    f'<circle class="point" r="2.5" cx="{x(i):.1f}" cy="{y(value):.1f}" data-bucket="{i}" '
                    f'data-value="{_number(value)}"><title>{e(series.name)}, {when}: {_number(value)}</title></circle>'
                )
        legend_y = PLOT_TOP + 14 * n + 4
        out.append(
            f'<rect x="{WIDTH - PLOT_RIGHT + 12}" y="{legend_y - 8}" width="10" height="10" stroke="none"/>'
            f'<text class="legend" x="{WIDTH - PLOT_RIGHT + 26}" y="{legend_y + 1}" stroke="none" fill="#1d1d1f">'
            f"{e(_short(series.name))}<title>{e(series.name)}</title></text></g>"
        )
    out.append("</svg>")
    return Markup("".join(out))


def _nice(top: float) -> float:
    """The top of the y axis: 1, 2 or 5 times a power of ten, at least ``top`` (1 when empty)."""
    if top <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(top))
    return float(next(m * power for m in (1, 2, 5, 10) if m * power >= top))


def _number(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


def _short(name: str) -> str:
    return name if len(name) <= 38 else name[:37] + "…"
