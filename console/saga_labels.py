"""What a saga's compensations do, named for people: the command each one sends.

A saga's log says ``place_order undone`` when a compensation was answered (and, in logs
written before this release, the same for a step that runs *after* compensation, though
that step undoes nothing: ``notify_cancellation`` sends the cancellation notice). The
console and ``estafeta sagas show`` name each by the command it sends, found, best first:

1. by building it from one saga's state, as the engine does when it sends it (exact);
2. from the factory's declaration: the class its code calls (``lambda s: CancelOrder(...)``)
   or the function's own name (``def cancel_order(state)``);
3. else by the step alone.

Building a command runs the app's factory, which only builds an object; any error there
falls back to the declaration, and the page is drawn all the same.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from estafeta import Saga, SagaState, SagaStep
from estafeta.messaging.messages import from_json
from estafeta_sql.sagas import LogEntry, SagaRow

#: The detail the engine writes when a compensation is answered (``place_order undone``), or a step
#: after compensation (``notify_cancellation done after compensating``; older logs say ``... undone``).
_UNDONE = re.compile(r"^(?P<step>\S+) (undone|done after compensating)$")


def command_name(factory: Callable[[SagaState], Any] | None, state: SagaState | None = None) -> str | None:
    """The name of the command ``factory`` builds: exact with ``state``, else read from its declaration."""
    if not factory:
        return None
    if state is not None:
        try:
            return type(factory(state)).__name__
        except Exception:  # the app's factory on old data: fall back to its declaration
            pass
    return _declared(factory)


def _declared(factory: Callable[..., Any], depth: int = 0) -> str | None:
    code, names = getattr(factory, "__code__", None), getattr(factory, "__globals__", {})
    if code is None:
        return None
    for name in code.co_names:
        found = names.get(name)
        if isinstance(found, type):
            return found.__name__
    # A factory made by a helper (``_notify("cancelled")``) calls the class in its closure's code.
    for cell in getattr(factory, "__closure__", None) or ():
        inner = cell.cell_contents
        if callable(inner) and depth < 2 and (got := _declared(inner, depth + 1)):
            return got
    name = getattr(factory, "__name__", "<lambda>")
    return None if name.startswith("<") else name


def _state(saga: Saga, row: SagaRow | None) -> SagaState | None:
    if row is None:
        return None
    try:
        return SagaState(row.saga_id, from_json(saga.data, row.payload), row.results)
    except Exception:  # its payload no longer decodes: the declaration still names the command
        return None


def undo_label(saga: Saga, step: SagaStep, row: SagaRow | None = None) -> str:
    """What undoing ``step`` does, or what a step after compensation does: ``CancelOrder``, ``notify_cancellation``."""
    state = _state(saga, row)
    if step in saga.after_compensation:
        return command_name(step.action, state) or step.name
    return command_name(step.compensation, state) or f"undo {step.name}"


def timeline_detail(saga: Saga, row: SagaRow, entry: LogEntry) -> str | None:
    """A log entry's detail for people: a compensation named by the command it sent."""
    found = _UNDONE.match(entry.detail or "")
    step = next((s for s in [*saga.steps, *saga.after_compensation] if found and s.name == found["step"]), None)
    if step is None:
        return entry.detail
    name = command_name(step.action if step in saga.after_compensation else step.compensation, _state(saga, row))
    if step in saga.after_compensation:
        return f"{step.name} done after compensating" + (f" (sent {name})" if name else "")
    return f"{step.name} compensated" + (f" by {name}" if name else "")


def transition_steps(saga: Saga, timeline: list[LogEntry]) -> list[str]:
    """For each entry of ``timeline``, the step its transition concerns, and where it moved the saga when elsewhere.

    The log records the step a saga stands on *after* each transition; the transition
    concerns the step it stood on before (the previous entry's): ``charge_payment`` failing
    reads ``charge_payment → undo place_order``, not ``place_order``. A step the saga stands
    on while compensating is its undo (``undo place_order``), unless it runs after
    compensation (``notify_cancellation``).
    """
    after = {step.name for step in saga.after_compensation}
    labels: list[str] = []
    before: str | None = None
    for entry in timeline:
        if entry.status == "compensating" and entry.step not in after:
            now = f"undo {entry.step}"
        elif before is not None and before.removeprefix("undo ") == entry.step:
            now = before  # still on the same step (ended there, failed there, sent again)
        else:
            now = entry.step
        concerned = now if before is None else before
        labels.append(concerned if concerned == now else f"{concerned} → {now}")
        before = now
    return labels
