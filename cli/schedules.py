"""``estafeta schedules``: the app's recurring schedules, their next and last firing, and an operator's hand on them."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import click

from estafeta import Schedule, Scheduler
from estafeta.schedules.spec import DeclaredOtherwise

from .context import current
from .tables import when

_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
_name_argument = click.argument("name", metavar="NAME")


@click.group("schedules")
def schedules_group() -> None:
    """List, pause, resume and trigger the app's recurring schedules (@service.schedule)."""


def _schedule(name: str) -> Schedule:
    try:
        return current().app.schedule(name)
    except KeyError as exc:
        raise click.BadParameter(str(exc.args[0]), param_hint="NAME") from None


def _scheduler(*schedules: Schedule) -> Scheduler:
    found = list(schedules) or current().app.schedules
    return Scheduler(current().runtime, found)


@contextlib.contextmanager
def _as_deployed() -> Iterator[None]:
    """A row that runs another declaration than this checkout's is refused, not rewritten (exit code 2)."""
    try:
        yield
    except DeclaredOtherwise as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None


def schedule_rows() -> list[dict[str, Any]]:
    """Every declared schedule with its stored state and its last run's fate (``ScheduleState.as_dict``)."""
    return [state.as_dict() for state in _scheduler().states()]


@schedules_group.command("list")
@_json_option
def list_command(as_json: bool) -> None:
    """Each schedule: its timing and policies, next firing, last firing, what became of its last run, last outcome.

    A schedule is registered (given its first tick) by the first worker that runs it,
    or by pause, resume or trigger (which refuse a schedule whose row runs another
    declaration than this checkout's). next: when the next tick fires (paused: none;
    unknown while its database is unreachable); last fired: the tick last fired and its
    run: waiting to be published, published, not processed yet, processed, dead-lettered,
    publish failed; outcome: what the last pass over a due tick (or an
    operator) did: fired, skipped by the overlap policy, missed by the catch-up policy,
    an error of the schedule's function.
    """
    rows = schedule_rows()
    if as_json:
        click.echo(json.dumps(rows, default=str))
        return
    if not rows:
        click.echo(f"app {current().app.name} declares no schedule")
        return
    for row in rows:
        if row["unreachable"]:
            state = f"unknown: {row['unreachable']}"
        elif not row["registered"]:
            state = "not registered yet: no worker has run since it was declared"
        elif row["paused"]:
            state = "paused"
        else:
            state = f"next {when(row['next_fire_at'])}"
        click.echo(f"{row['name']}  {row['spec']}  (overlap {row['overlap']}, catch-up {row['catch_up']})  {state}")
        click.echo(
            f"    last fired {when(row['last_tick'])}: {row['last_run'] or '-'};"
            f" fired {row['fired']}, skipped {row['skipped']}, missed {row['missed']}"
        )
        click.echo(f"    last outcome {when(row['last_outcome_at'])}: {row['last_outcome'] or '-'}")


@schedules_group.command("pause")
@_name_argument
def pause_command(name: str) -> None:
    """Stop NAME's ticks from firing (in every worker) until `estafeta schedules resume NAME`."""
    schedule = _schedule(name)
    with _as_deployed():
        changed = _scheduler(schedule).set_paused(schedule, paused=True)
    click.echo(f"schedule {schedule.full_name} {'paused' if changed else 'was paused already'}")


@schedules_group.command("resume")
@_name_argument
def resume_command(name: str) -> None:
    """Let NAME fire again, from its first tick after now (ticks that fell while paused are not caught up).

    A schedule that is not paused is left as it is (its due tick still fires).
    """
    schedule = _schedule(name)
    with _as_deployed():
        changed = _scheduler(schedule).set_paused(schedule, paused=False)
    row = next(r for r in schedule_rows() if r["name"] == schedule.full_name)
    done = "resumed" if changed else "was not paused"
    click.echo(f"schedule {schedule.full_name} {done}; next tick {when(row['next_fire_at'])}")


@schedules_group.command("trigger")
@_name_argument
def trigger_command(name: str) -> None:
    """Fire NAME once now, outside its ticks: its command goes to the outbox; its next tick stays."""
    schedule = _schedule(name)
    with _as_deployed():
        message_id = _scheduler(schedule).trigger(schedule)
    if message_id is None:
        click.echo(f"schedule {schedule.full_name} triggered: its function sent nothing")
    else:
        click.echo(f"schedule {schedule.full_name} triggered: message {message_id}")


COMMANDS = [schedules_group]
