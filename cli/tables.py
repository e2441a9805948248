"""How the CLI prints for a person: tables under a header, and times with their date, in UTC.

Every command that prints columns goes through :func:`table_lines` (or :func:`echo_table`),
and every time through :func:`when`, so that all of them read alike: a header in capitals,
columns two spaces apart, numbers right-aligned, and ``2026-11-30 16:28:48 UTC`` for a time.
A time without its date is ambiguous at 3 a.m. and a time in the reader's zone cannot be
compared with the logs of another machine; UTC with the date is both. ``--json`` outputs
do not go through here: they keep the formats scripts read.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import click

#: What a cell with no value prints.
NOTHING = "-"
#: A table cell: text (left-aligned), or a number (right-aligned; a float with one decimal).
Cell = str | int | float | None


def when(moment: datetime | None, *, precise: bool = False) -> str:
    """``moment`` in UTC with its date: ``2026-11-30 16:28:48 UTC`` (microseconds when ``precise``).

    :data:`NOTHING` when there is no time. The date, the time and the zone are always
    there, whatever zone the database session hands the time in.
    """
    if moment is None:
        return NOTHING
    shape = "%Y-%m-%d %H:%M:%S.%f UTC" if precise else "%Y-%m-%d %H:%M:%S UTC"
    return moment.astimezone(UTC).strftime(shape)


def _text(cell: Cell) -> str:
    if cell is None:
        return NOTHING
    if isinstance(cell, float):
        return f"{cell:.1f}"
    # One row, one line: a value with line breaks (an error's text) would break the columns.
    return " ".join(str(cell).splitlines())


def _is_number(cell: Cell) -> bool:
    return isinstance(cell, int | float) and not isinstance(cell, bool)


def table_lines(
    header: Sequence[str], rows: Sequence[Sequence[Cell]], *, red: Sequence[bool] = (), indent: str = ""
) -> list[str]:
    """The header, then one line per row, each column as wide as its widest cell.

    A column whose cells are all numbers is right-aligned (its header too); the others are
    left-aligned. Trailing spaces are cut. A row whose flag in ``red`` is true is styled
    red (``click.echo`` drops the colour when the output is not a terminal).
    """
    texts = [[_text(cell) for cell in row] for row in rows]
    columns = list(zip(header, *texts, strict=True))
    widths = [max(len(text) for text in column) for column in columns]
    right = [bool(rows) and all(_is_number(row[i]) for row in rows) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        laid = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)]
        return (indent + "  ".join(laid)).rstrip()

    flags = list(red) or [False] * len(texts)
    out = [line(header)]
    out += [click.style(line(cells), fg="red") if bad else line(cells) for cells, bad in zip(texts, flags, strict=True)]
    return out


def echo_table(
    header: Sequence[str], rows: Sequence[Sequence[Cell]], *, empty: str, red: Sequence[bool] = (), indent: str = ""
) -> None:
    """Print :func:`table_lines`, or the one line ``empty`` (saying there is nothing) when there are no rows."""
    if not rows:
        click.echo(empty)
        return
    for text in table_lines(header, rows, red=red, indent=indent):
        click.echo(text)
