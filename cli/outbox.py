"""``estafeta outbox``: what is waiting, what failed, putting failed rows back, and moving scheduled ones."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import click

from estafeta_sql import inbox, outbox_admin, plan
from estafeta_sql.errors import MessageAlreadyPublished, ScheduledMessageRefused

from .context import current
from .tables import echo_table, when


def _services(names: tuple[str, ...]) -> list[str]:
    return current().services(names)


_service_option = click.option("--service", "services", multiple=True, help="Only this service (repeatable).")
_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


@click.group("outbox")
def outbox_group() -> None:
    """Inspect and repair the services' outboxes."""


@outbox_group.command("stats")
@_service_option
@click.option("--by-type", is_flag=True, help="One line per message type (command or event class) per service.")
@_json_option
def stats_command(services: tuple[str, ...], by_type: bool, as_json: bool) -> None:
    """What waits in each service's outbox, how long the oldest has waited, and why it is stuck.

    pending: not yet published (due, delayed or retrying); failed: out of attempts (see
    `estafeta outbox failed`); retrying: refused by the broker, waiting for another try;
    delayed: sent with a delay not yet over; blocked keys: ordering keys whose later
    rows wait behind a failed row; oldest wait: the longest any row that should be out
    by now has waited. With --by-type: pending and failed rows per message type, and when
    the oldest row of the type was written; "(unknown)" counts rows written before the
    outbox recorded types.
    """
    if by_type:
        _stats_by_type(services, as_json)
        return
    runtime = current().runtime
    rows = {}
    for name in _services(services):
        with runtime.database(name).connection() as conn:
            rows[name] = outbox_admin.stats(conn, name)
    if as_json:
        click.echo(json.dumps({name: _asdict(s) for name, s in rows.items()}))
        return
    echo_table(
        ("SERVICE", "PENDING", "FAILED", "RETRYING", "DELAYED", "BLOCKED KEYS", "OLDEST WAIT (S)"),
        [
            (name, s.pending, s.failed, s.retrying, s.delayed, s.blocked_keys, float(s.oldest_pending_age_seconds))
            for name, s in rows.items()
        ],
        empty="no services",
    )
    notes = [f"{name}: oldest error: {s.oldest_error}" for name, s in rows.items() if s.oldest_error]
    if any(s.failed for s in rows.values()):
        notes.append("failed rows: `estafeta outbox failed`; once the cause is fixed: `estafeta outbox retry --all`")
    for note in ["", *notes] if notes else []:
        click.echo(note)


#: How ``--by-type`` shows rows written before the outbox recorded types.
UNKNOWN_TYPE = "(unknown)"


def _stats_by_type(services: tuple[str, ...], as_json: bool) -> None:
    runtime = current().runtime
    found = []
    for name in _services(services):
        with runtime.database(name).connection() as conn:
            found += [(name, s) for s in outbox_admin.stats_by_type(conn, name)]
    if as_json:
        rows = [{"service": name, **_asdict(s), "message_type": s.message_type or UNKNOWN_TYPE} for name, s in found]
        click.echo(json.dumps(rows, default=str))
        return
    echo_table(
        ("SERVICE", "TYPE", "PENDING", "FAILED", "OLDEST"),
        [(name, s.message_type or UNKNOWN_TYPE, s.pending, s.failed, when(s.oldest_created_at)) for name, s in found],
        empty="no rows in the outboxes",
    )


@outbox_group.command("failed")
@_service_option
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True, help="At most this many.")
@_json_option
def failed_command(services: tuple[str, ...], limit: int, as_json: bool) -> None:
    """Rows that exhausted their publish attempts, with their last error (oldest first)."""
    runtime = current().runtime
    found = []
    for name in _services(services):
        with runtime.database(name).connection() as conn:
            found += [{"service": name, **row} for row in outbox_admin.list_failed(conn, name, limit)]
    if as_json:
        click.echo(json.dumps(found, default=str))
        return
    for row in found:
        key = f" key={row['ordering_key']}" if row["ordering_key"] else ""
        click.echo(
            f"{row['service']} #{row['id']} {row['actor_name']}{key} attempts={row['attempts']}: {row['last_error']}"
        )
    if not found:
        click.echo("no failed rows")


@outbox_group.command("retry")
@click.argument("row_id", type=click.IntRange(min=1), required=False)
@click.option("--all", "retry_all", is_flag=True, help="Every failed row.")
@_service_option
def retry_command(row_id: int | None, retry_all: bool, services: tuple[str, ...]) -> None:
    """Put a failed row (ROW_ID, as `estafeta outbox failed` shows it) or --all failed rows back to pending.

    The row is published again with a fresh count of attempts; the rows of its key that
    waited behind it follow it, in order.
    """
    runtime = current().runtime
    if (row_id is None) == (not retry_all):
        raise click.UsageError("give a ROW_ID or --all (not both)")
    names = _services(services)
    if row_id is not None:
        names = [name for name in names if _has_failed_row(runtime, name, row_id)]
        if not names:
            raise click.BadParameter(f"no failed outbox row {row_id}", param_hint="ROW_ID")
        if len(names) > 1:
            raise click.BadParameter(
                f"failed row {row_id} exists in {' and '.join(names)}: add --service", param_hint="ROW_ID"
            )
    total = 0
    for name in names:
        with runtime.database(name).connection() as conn:
            total += len(outbox_admin.retry_failed(conn, name, row_id))
    click.echo(f"{total} row(s) back to pending")


@outbox_group.command("scheduled")
@_service_option
@click.option(
    "--limit", type=click.IntRange(min=1), default=100, show_default=True, help="At most this many per service."
)
@_json_option
def scheduled_command(services: tuple[str, ...], limit: int, as_json: bool) -> None:
    """Messages sent with a delay or for a time that is not here yet, soonest first.

    MESSAGE_ID is the id `send(..., delay=/at=)` returned: `estafeta outbox cancel` and
    `estafeta outbox reschedule` take it. Times are the service's clock.
    """
    runtime = current().runtime
    found = []
    for name in _services(services):
        with runtime.database(name).connection() as conn:
            found += [{"service": name, **_asdict(row)} for row in outbox_admin.list_scheduled(conn, name, limit)]
    found.sort(key=lambda row: row["available_at"])
    if as_json:
        click.echo(json.dumps(found, default=str))
        return
    echo_table(
        ("DUE", "SERVICE", "MESSAGE ID", "TYPE"),
        [
            (
                when(row["available_at"]),
                row["service"],
                str(row["message_id"]),
                row["message_type"] or row["actor_name"],
            )
            for row in found
        ],
        empty="no scheduled messages",
    )


def _parse_at(value: str) -> datetime:
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO 8601 time (2026-12-24T18:00:00+01:00)") from None
    if at.tzinfo is None:
        raise click.BadParameter(f"{value!r} has no time zone: add one (+00:00, Z)")
    return at


def _change(services: tuple[str, ...], message_id: uuid.UUID, change: Callable[[str], plan.Plan[None]]) -> str:
    """Run ``change`` in the service whose outbox holds ``message_id``; return that service."""
    runtime = current().runtime
    names = _services(services)
    for name in names:
        try:
            with runtime.database(name).transaction() as conn:
                plan.run(conn, change(name))
            return name
        except MessageAlreadyPublished:
            continue
        except ScheduledMessageRefused as refused:
            raise click.BadParameter(str(refused), param_hint="MESSAGE_ID") from None
    raise click.BadParameter(
        f"message {message_id} is in no outbox of {', '.join(names)}: already published, cancelled, or never sent",
        param_hint="MESSAGE_ID",
    )


@outbox_group.command("cancel")
@click.argument("message_id", type=click.UUID)
@_service_option
def cancel_command(message_id: uuid.UUID, services: tuple[str, ...]) -> None:
    """Take a message that waits in an outbox (MESSAGE_ID, as `estafeta outbox scheduled` shows it) out of it.

    Refused (exit 2) once a relay is publishing it or it was published: exactly one of
    the cancel and the publish wins.
    """
    name = _change(services, message_id, lambda schema: outbox_admin.cancel_plan(schema, message_id))
    click.echo(f"cancelled message {message_id} in {name}'s outbox")


@outbox_group.command("reschedule")
@click.argument("message_id", type=click.UUID)
@click.option("--at", "at", required=True, help="The new time, ISO 8601 with a time zone (2026-12-24T18:00:00Z).")
@_service_option
def reschedule_command(message_id: uuid.UUID, at: str, services: tuple[str, ...]) -> None:
    """Make a waiting message (MESSAGE_ID) due at another time, by the service's clock.

    A time already past makes it due now. Refused (exit 2) once a relay is publishing it
    or it was published.
    """
    due = _parse_at(at)
    name = _change(services, message_id, lambda schema: outbox_admin.reschedule_plan(schema, message_id, due))
    click.echo(f"message {message_id} in {name}'s outbox now due at {due.isoformat()}")


def _has_failed_row(runtime: Any, service: str, row_id: int) -> bool:
    with runtime.database(service).connection() as conn:
        return bool(outbox_admin.list_failed(conn, service, 1, row_id))


@outbox_group.command("dead-letters")
@_service_option
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="At most this many.")
@_json_option
def dead_letters_command(services: tuple[str, ...], limit: int, as_json: bool) -> None:
    """Messages the workers refused (undecodable, invalid, failing every retry), newest first."""
    runtime = current().runtime
    found = []
    for name in _services(services):
        with runtime.database(name).connection() as conn:
            found += [{"service": name, **row} for row in inbox.list_dead_letters(conn, name, limit)]
    if as_json:
        click.echo(json.dumps(found, default=str))
        return
    echo_table(
        ("SERVICE", "ID", "PARKED", "REASON"),
        [(row["service"], row["id"], when(row["created_at"]), row["reason"]) for row in found],
        empty="no dead letters",
    )


def _asdict(value: Any) -> dict[str, Any]:
    import attrs

    return attrs.asdict(value)


COMMANDS = [outbox_group]
