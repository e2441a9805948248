"""``estafeta sagas``: list, inspect, resume, abort and watch sagas."""

from __future__ import annotations

import json
import signal
import threading
import uuid
from typing import TYPE_CHECKING, Any

import attrs
import click

from estafeta import SagaError, SagaNotFound, Watchdog
from estafeta_console import saga_labels
from estafeta_sql import saga_reports, sagas

from .context import current
from .saga_start import start_command
from .tables import echo_table, when

if TYPE_CHECKING:
    from estafeta import Saga
    from estafeta_sql.sagas import SagaRow

_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
_kind_option = click.option(
    "--saga", "kind", help="The saga kind (default: the app's only one; `order` in the order system)."
)


#: What ``sagas show`` says of a saga the watchdog gave up on (the runbook says more).
GAVE_UP_HINT = (
    "not final: the watchdog stopped waiting, and a late reply may still move it on. Never compensate"
    " by hand: check what the participant did, then wait for its answer or `estafeta sagas resume` it"
)


def _saga(kind: str | None) -> Saga:
    return current().saga(kind)


def _row_json(row: SagaRow) -> dict[str, Any]:
    return json.loads(json.dumps(attrs.asdict(row), default=str))  # type: ignore[no-any-return]


@click.group("sagas")
def sagas_group() -> None:
    """Inspect sagas and move them on by hand."""


@sagas_group.command("list")
@click.option(
    "--status",
    type=click.Choice(sagas.STATUSES),
    help="Only sagas in this status (gave_up: the watchdog stopped waiting; a late reply may still move it).",
)
@click.option("--stuck", is_flag=True, help="Only live sagas past their deadline.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="At most this many.")
@_kind_option
@_json_option
def list_command(status: str | None, stuck: bool, limit: int, kind: str | None, as_json: bool) -> None:
    """The newest sagas first, with their current step and last error."""
    runtime = current().runtime
    saga = _saga(kind)
    with runtime.database(saga.service).connection() as conn:
        rows = saga_reports.search(conn, saga.table, status=status, stuck=stuck, limit=limit)
    if as_json:
        click.echo(json.dumps([_row_json(r) for r in rows]))
        return
    echo_table(
        ("STARTED", "SAGA", "STATUS", "STEP", "VERSION", "LAST ERROR"),
        [(when(r.started_at), str(r.saga_id), r.status, r.current_step, r.version, r.last_error) for r in rows],
        empty="no sagas",
    )


@sagas_group.command("show")
@click.argument("saga_id", type=click.UUID)
@_kind_option
@_json_option
def show_command(saga_id: uuid.UUID, kind: str | None, as_json: bool) -> None:
    """A saga's state and the timeline of its transitions."""
    runtime = current().runtime
    saga = _saga(kind)
    with runtime.database(saga.service).connection() as conn:
        row = sagas.get(conn, saga.table, saga_id)
        if row is None:
            raise click.BadParameter(f"no {saga.name} saga {saga_id}", param_hint="SAGA_ID")
        timeline = sagas.timeline(conn, saga.table, saga_id)
    if as_json:
        entries = [json.loads(json.dumps(attrs.asdict(e), default=str)) for e in timeline]
        click.echo(json.dumps({**_row_json(row), "timeline": entries}))
        return
    click.echo(f"saga {row.saga_id} ({saga.name} {row.key}): {row.status} at {row.current_step}, version {row.version}")
    if row.live:
        click.echo(f"waiting since {when(row.updated_at)}, attempt {row.attempts}, deadline {when(row.deadline_at)}")
    if row.last_error:
        click.echo(f"last error: {row.last_error}")
    if row.status == sagas.GAVE_UP:
        click.echo(GAVE_UP_HINT)
    # Each transition's step is the one it concerns (and where it moved the saga), and a
    # compensation is named by the command it sent, as the console shows them.
    steps = saga_labels.transition_steps(saga, timeline)
    cells = [
        (when(e.at, precise=True), e.version, e.event, e.status, step, saga_labels.timeline_detail(saga, row, e))
        for e, step in zip(timeline, steps, strict=True)
    ]
    echo_table(("AT", "VERSION", "EVENT", "STATUS", "STEP", "DETAIL"), cells, empty="  no transitions", indent="  ")


@sagas_group.command("resume")
@click.argument("saga_ids", nargs=-1, type=click.UUID)
@_kind_option
@_json_option
def resume_command(saga_ids: tuple[uuid.UUID, ...], kind: str | None, as_json: bool) -> None:
    """Re-send the current command of every live saga now (or of SAGA_IDS); retry a failed SAGA_ID's step.

    Safe at any time: a participant that already handled a re-sent command absorbs it
    in its inbox. Give the ids of failed sagas once their cause is fixed.
    """
    runtime = current().runtime
    saga = _saga(kind)
    database = runtime.database(saga.service)
    if not saga_ids:
        with database.connection() as conn:
            saga_ids = tuple(sagas.live(conn, saga.table, 1_000_000))
    done: dict[str, str] = {}
    for saga_id in saga_ids:
        try:
            with database.transaction() as conn:
                done[str(saga_id)] = saga.resume(conn, saga_id)
        except SagaNotFound as exc:
            raise click.BadParameter(str(exc), param_hint="SAGA_IDS") from None
        except SagaError as exc:
            done[str(saga_id)] = f"refused: {exc}"
    if as_json:
        click.echo(json.dumps(done))
    else:
        for saga_id_text, outcome in done.items():
            click.echo(f"{saga_id_text}: {outcome}")
        click.echo(f"{sum(not o.startswith('refused') for o in done.values())} saga(s) moved on")
    if any(o.startswith("refused") for o in done.values()):
        raise click.exceptions.Exit(1)


@sagas_group.command("abort")
@click.argument("saga_id", type=click.UUID)
@click.option("--reason", default="by an operator", show_default=True, help="Recorded as the saga's last error.")
@_kind_option
def abort_command(saga_id: uuid.UUID, reason: str, kind: str | None) -> None:
    """Compensate a running saga now, its current step included (not past its point of no return)."""
    runtime = current().runtime
    saga = _saga(kind)
    try:
        with runtime.database(saga.service).transaction() as conn:
            saga.abort(conn, saga_id, reason)
    except SagaNotFound as exc:
        raise click.BadParameter(str(exc), param_hint="SAGA_ID") from None
    click.echo(f"saga {saga_id}: compensating")


@sagas_group.command("watch")
@click.option("--once", is_flag=True, help="Handle what is overdue now, then exit.")
@click.option(
    "--interval", type=click.FloatRange(min=0.01), help="Seconds between looks [ESTAFETA_SAGA_WATCH_INTERVAL]."
)
def watch_command(once: bool, interval: float | None) -> None:
    """Re-send the commands of sagas past their deadline; compensate or fail those out of attempts.

    Every `dramatiq estafeta_actors` worker process already runs this watchdog; run it alone when
    the workers run elsewhere. Several watchdogs at once are safe.
    """
    context = current()
    watchdog = Watchdog(context.runtime, context.app.sagas)
    if once:
        done = watchdog.check_once()
        click.echo(", ".join(f"{k} {v}" for k, v in sorted(done.items())) or "nothing overdue")
        return
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    watchdog.run(stop, interval)


sagas_group.add_command(start_command)

COMMANDS = [sagas_group]
