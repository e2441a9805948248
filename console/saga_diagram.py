"""A saga kind drawn as SVG from its declaration, and where one saga of that kind stands on it.

Drawn on the server, as text, with nothing to load: the console's pages forbid scripts and
every network fetch (``default-src 'none'``), and a diagram must show at 3 a.m. on a
machine with no way out. Every label is escaped here (step names are the app's, but a
saga's error text is not).

The drawing, left to right: the steps in the order declared (a step done by whoever
starts the saga is marked so; a retriable step is past the point of no return, drawn
with a double border and no undo); under each step that has a compensation, its undo;
the steps that run after compensation and the two ends, ``completed`` and
``compensated``. An arrow joins a step to the next in the list, or, for a step that
chooses (``then``), to each of its declared ``branches`` (arcs over the row); a step that
chooses without declaring its branches gets a dashed ``chooses at run time`` mark.
Compensations run right to left along the path taken. For one saga, the steps it did,
the undos it ran and the arrows between them are drawn as taken, where it stands
(waiting on a step, on an undo, failed, or at an end) is outlined, and the step whose
failure turned it to compensation is marked in red. For a kind, each node can carry how
many sagas stand on it now.
"""

from __future__ import annotations

import html
import itertools
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
from markupsafe import Markup

from estafeta import Saga, SagaState, SagaStep
from estafeta_sql import saga_lookup
from estafeta_sql.sagas import LogEntry, SagaRow

from . import saga_labels

WIDTH, HEIGHT, GAP, LEFT = 150, 44, 46, 16
#: The tops of the rows: steps, their undos, what runs after compensation.
ROWS = (70, 170, 270)
COMPLETED, COMPENSATED = "end:completed", "end:compensated"


@attrs.frozen
class Node:
    """A box of the diagram; ``id`` is ``do:<step>``, ``undo:<step>``, ``after:<step>`` or ``end:<status>``."""

    id: str
    label: str
    #: A second, smaller line.
    note: str
    x: int
    y: int
    kind: str


@attrs.frozen
class Edge:
    """An arrow from one node to another; ``kind``: ``next``, ``branch``, ``undo`` or ``after``."""

    source: str
    target: str
    kind: str


@attrs.frozen
class Position:
    """Where one saga is on its kind's diagram."""

    #: The nodes it has been through, in order, the one it stands on last.
    path: list[str]
    #: The node it stands on (waiting, failed, or an end).
    current: str
    #: ``current`` is where it failed.
    failed: bool
    #: The step whose failure (or abort) turned the saga to compensation (``do:<step>``), if it did.
    failing: str | None = None


@attrs.frozen
class Diagram:
    """A saga kind's nodes and edges, laid out."""

    nodes: list[Node]
    edges: list[Edge]
    width: int
    height: int


def layout(saga: Saga) -> Diagram:
    """The diagram of ``saga``'s declaration."""
    steps = list(saga.steps)
    nodes = [_step_node(step, i) for i, step in enumerate(steps)]
    nodes.append(Node(COMPLETED, "completed", "every step done", _x(len(steps)), ROWS[0], "end"))
    undone = [(i, s) for i, s in enumerate(steps) if s.compensation]
    # Each compensation says what it does: the command it sends (saga_labels), not only "undo".
    nodes += [
        Node(f"undo:{s.name}", f"undo {s.name}", _sends(s.compensation, "compensation"), _x(i), ROWS[1], "undo")
        for i, s in undone
    ]
    after = list(saga.after_compensation)
    nodes += [
        Node(f"after:{s.name}", s.name, _sends(s.action, "after compensation"), _x(i), ROWS[2], "after")
        for i, s in enumerate(after)
    ]
    nodes.append(Node(COMPENSATED, "compensated", "undone, in reverse", _x(len(after)), ROWS[2], "end"))
    edges = [edge for i, step in enumerate(steps) for edge in _forward(steps, i, step)]
    chain = [f"undo:{s.name}" for _, s in reversed(undone)] + [f"after:{s.name}" for s in after] + [COMPENSATED]
    edges += [Edge(a, b, "undo" if a.startswith("undo:") else "after") for a, b in itertools.pairwise(chain)]
    columns = max(len(steps), len(after)) + 1
    return Diagram(nodes, edges, _x(columns) + LEFT, ROWS[2] + HEIGHT + 30)


def _sends(factory: Callable[[SagaState], Any] | None, otherwise: str) -> str:
    name = saga_labels.command_name(factory)
    return f"sends {name}" if name else otherwise


def _x(column: int) -> int:
    return LEFT + column * (WIDTH + GAP)


def _step_node(step: SagaStep, column: int) -> Node:
    if step.action is None:
        note, kind = "done by the saga's starter", "step"
    elif step.retriable:
        note, kind = "retriable: never undone", "retriable"
    elif step.compensation:
        note, kind = "undone if a later step fails", "step"
    else:
        note, kind = "nothing to undo", "step"
    if step.then is not None:
        note = "chooses the next step"
    return Node(f"do:{step.name}", step.name, note, _x(column), ROWS[0], kind)


def _forward(steps: Sequence[SagaStep], index: int, step: SagaStep) -> list[Edge]:
    source = f"do:{step.name}"
    if step.then is None:
        target = f"do:{steps[index + 1].name}" if index + 1 < len(steps) else COMPLETED
        return [Edge(source, target, "next")]
    if not step.branches:
        return [Edge(source, "?", "choice")]
    return [Edge(source, COMPLETED if b is None else f"do:{b}", "branch") for b in step.branches]


def position(saga: Saga, row: SagaRow, timeline: Sequence[LogEntry]) -> Position:
    """Where the saga of ``row`` stands: the steps it did, the undos it ran, and its current node."""
    done = [f"do:{s.name}" for s in _done(saga, row)]
    path = list(done)
    step_ids = {s.name for s in saga.steps}
    if row.compensations is None:
        if row.status == "completed":
            return Position([*path, COMPLETED], COMPLETED, failed=False)
        current = f"do:{row.current_step}"
        if current not in path:
            path.append(current)
        return Position(path, current, failed=row.status == "failed")
    failed_at = _failed_step(timeline)
    failing = f"do:{failed_at}" if failed_at in step_ids else None
    if failing and failing not in path:
        path.append(failing)
    plan = [_undo_id(saga, name) for name in row.compensations]
    if row.status == "compensated":
        return Position([*path, *plan, COMPENSATED], COMPENSATED, failed=False, failing=failing)
    reached = plan[: plan.index(_undo_id(saga, row.current_step)) + 1] if row.current_step in row.compensations else []
    current = reached[-1] if reached else path[-1]
    return Position([*path, *reached], current, failed=row.status == "failed", failing=failing)


def _done(saga: Saga, row: SagaRow) -> list[SagaStep]:
    try:
        return saga.path(row)
    except Exception:  # a payload that no longer decodes, a choice that raises: the page still shows
        return [s for s in saga.steps if s.action is None or s.name in row.results]


def _undo_id(saga: Saga, name: str) -> str:
    return f"after:{name}" if any(s.name == name for s in saga.after_compensation) else f"undo:{name}"


def _failed_step(timeline: Sequence[LogEntry]) -> str | None:
    """The step running when compensation began: the last one logged as running before it."""
    running = None
    for entry in timeline:
        if entry.status in ("compensating", "compensated"):
            return running
        if entry.status == "running":
            running = entry.step
    return running


def standing(saga: Saga, rows: Sequence[saga_lookup.Standing]) -> dict[str, int]:
    """How many sagas stand on each node now, from :func:`estafeta_sql.saga_lookup.standing_by_step`'s counts."""
    counts: dict[str, int] = {}
    for row in rows:
        node = _undo_id(saga, row.step) if row.compensating else f"do:{row.step}"
        counts[node] = counts.get(node, 0) + row.count
    return counts


def render(saga: Saga, where: Position | None = None, *, counts: Mapping[str, int] | None = None) -> Markup:
    """``saga``'s diagram as an inline ``<svg>`` element.

    With ``where``, that saga's path highlighted and the step that failed marked; with
    ``counts``, how many sagas stand on each node (a count in its corner).
    """
    diagram = layout(saga)
    edges = list(diagram.edges)
    if where is not None:
        drawn = {(e.source, e.target) for e in edges}
        hops = list(itertools.pairwise(where.path))
        # A hop the declaration does not show (a choice of undeclared branches, a failure
        # jumping into the undos) is drawn for this saga alone.
        edges += [Edge(a, b, "jump") for a, b in hops if (a, b) not in drawn]
        taken_hops, visited = set(hops), set(where.path)
    else:
        taken_hops, visited = set(), set()
    by_id = {node.id: node for node in diagram.nodes}
    parts = [
        f'<svg class="saga-diagram" xmlns="http://www.w3.org/2000/svg" role="img" width="{diagram.width}"'
        f' height="{diagram.height}" viewBox="0 0 {diagram.width} {diagram.height}" data-kind="{_e(saga.name)}">',
        f"<title>{_e(saga.name)} saga</title>",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerUnits="userSpaceOnUse"'
        ' markerWidth="9" markerHeight="9" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z" fill="#777"/></marker></defs>',
    ]
    parts += [_edge(e, by_id, (e.source, e.target) in taken_hops) for e in edges]
    parts += [_node(n, n.id in visited, where, list_of(saga.name, n.id)) for n in diagram.nodes]
    parts += [_count(n, counts[n.id]) for n in diagram.nodes if counts and counts.get(n.id)]
    parts.append("</svg>")
    return Markup("\n".join(parts))


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def list_of(kind: str, node: str) -> str:
    """The console's list of the sagas of ``kind`` standing on ``node`` (waiting there, or ended there)."""
    role, _, name = node.partition(":")
    if role == "end":
        query = {"kind": kind, "status": name}
    elif role == "do":
        query = {"kind": kind, "step": name}
    else:  # an undo, or a step after compensation: the saga is compensating (or failed) there
        query = {"kind": kind, "step": name, "status": "compensating"}
    return "/console/sagas?" + urllib.parse.urlencode(query)


def _node(node: Node, visited: bool, where: Position | None, href: str) -> str:
    classes = ["node", node.kind]
    if visited:
        classes.append("taken")
    if where is not None and node.id == where.current:
        classes.append("failed" if where.failed else "current")
    if where is not None and node.id == where.failing:
        classes.append("failing")
    double = (
        f'<rect x="{node.x + 3}" y="{node.y + 3}" width="{WIDTH - 6}" height="{HEIGHT - 6}" rx="4" class="inner"/>'
        if node.kind == "retriable"
        else ""
    )
    return (
        f'<a href="{_e(href)}"><g class="{" ".join(classes)}" data-node="{_e(node.id)}">'
        f'<rect x="{node.x}" y="{node.y}" width="{WIDTH}" height="{HEIGHT}" rx="6"/>{double}'
        f'<text x="{node.x + WIDTH / 2}" y="{node.y + 18}" class="label">{_e(_clip(node.label))}</text>'
        f'<text x="{node.x + WIDTH / 2}" y="{node.y + 34}" class="note">{_e(_clip(node.note, 28))}</text></g></a>'
    )


def _count(node: Node, count: int) -> str:
    """A count in the node's top right corner: how many sagas stand there now."""
    x, y = node.x + WIDTH - 4, node.y - 7
    return (
        f'<g class="count" data-node="{_e(node.id)}" data-count="{count}">'
        f'<rect x="{x - 30}" y="{y}" width="34" height="15" rx="7"/>'
        f'<text x="{x - 13}" y="{y + 11}">{count}</text></g>'
    )


def _clip(text: str, most: int = 22) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


def _edge(edge: Edge, by_id: dict[str, Node], taken_hop: bool) -> str:
    source = by_id[edge.source]
    classes = f"edge {edge.kind}" + (" taken" if taken_hop else "")
    data = f'data-from="{_e(edge.source)}" data-to="{_e(edge.target)}"'
    if edge.target == "?":
        x, y = source.x + WIDTH / 2, source.y
        return (
            f'<g class="{classes}" {data}><path d="M{x},{y} L{x},{y - 24}" marker-end="url(#arrow)"/>'
            f'<text x="{x + 6}" y="{y - 28}" class="note">chooses at run time (no branches declared)</text></g>'
        )
    target = by_id[edge.target]
    return f'<path class="{classes}" {data} d="{_route(source, target)}" marker-end="url(#arrow)"/>'


def _route(source: Node, target: Node) -> str:
    """A straight arrow between neighbours on a row or across rows; an arc round the row otherwise."""
    if source.y != target.y:
        down = target.y > source.y
        y1, y2 = source.y + (HEIGHT if down else 0), target.y + (0 if down else HEIGHT)
        return f"M{source.x + WIDTH / 2},{y1} L{target.x + WIDTH / 2},{y2}"
    y = source.y + HEIGHT / 2
    if abs(target.x - source.x) == WIDTH + GAP:
        forward = target.x > source.x
        x1, x2 = source.x + (WIDTH if forward else 0), target.x + (0 if forward else WIDTH)
        return f"M{x1},{y} L{x2},{y}"
    mid1, mid2 = source.x + WIDTH / 2, target.x + WIDTH / 2
    span = abs(target.x - source.x) / (WIDTH + GAP)
    if source.y == ROWS[0]:  # over the steps
        edge, bend = source.y, source.y - 14 - 8 * span
    else:  # under the undos (nothing is drawn between the rows but arrows)
        edge, bend = source.y + HEIGHT, source.y + HEIGHT + 14 + 4 * span
    return f"M{mid1},{edge} C{mid1},{bend} {mid2},{bend} {mid2},{edge}"
