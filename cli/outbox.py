"""``estafeta outbox``: what is waiting, what failed, and putting failed rows back."""

from __future__ import annotations

import json
from typing import Any

import click

from sql import inbox
from sql import outbox as store


def _services(names: tuple[str, ...]) -> list[str]:
    from actors.services import all_services

    known = [s.name for s in all_services()]
    for name in names:
        if name not in known:
            raise click.BadParameter(f"no service {name!r} (known: {', '.join(known)})", param_hint="--service")
    return list(names) or known


_service_option = click.option("--service", "services", multiple=True, help="Only this service (repeatable).")
_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


@click.group("outbox")
def outbox_group() -> None:
    """Inspect and repair the services' outboxes."""


@outbox_group.command("stats")
@_service_option
@_json_option
def stats_command(services: tuple[str, ...], as_json: bool) -> None:
    """Pending and failed rows and the age of the oldest pending row, per service."""
    from actors import runtime

    rows = {}
    for name in _services(services):
        with runtime.database(name).connection() as conn:
            rows[name] = store.stats(conn, name)
    if as_json:
        click.echo(json.dumps({name: _asdict(s) for name, s in rows.items()}))
        return
    click.echo(f"{'service':<15}{'pending':>10}{'failed':>10}{'oldest pending':>18}")
    for name, s in rows.items():
        click.echo(f"{name:<15}{s.pending:>10}{s.failed:>10}{s.oldest_pending_age_seconds:>16.1f} s")


@outbox_group.command("failed")
@_service_option
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@_json_option
def failed_command(services: tuple[str, ...], limit: int, as_json: bool) -> None:
    """Rows that exhausted their publish attempts, with their last error."""
    from actors import runtime

    found = []
    for name in _services(services):
        with runtime.database(name).connection() as conn:
            found += [{"service": name, **row} for row in store.list_failed(conn, name, limit)]
    if as_json:
        click.echo(json.dumps(found, default=str))
        return
    for row in found:
        click.echo(f"{row['service']} #{row['id']} {row['actor_name']} attempts={row['attempts']}: {row['last_error']}")
    if not found:
        click.echo("no failed rows")


@outbox_group.command("retry")
@click.argument("row_id", type=click.IntRange(min=1), required=False)
@click.option("--all", "retry_all", is_flag=True, help="Every failed row.")
@_service_option
def retry_command(row_id: int | None, retry_all: bool, services: tuple[str, ...]) -> None:
    """Put a failed row (ROW_ID) or --all failed rows back to pending."""
    from actors import runtime

    if (row_id is None) == (not retry_all):
        raise click.UsageError("give a ROW_ID or --all (not both)")
    total = 0
    for name in _services(services):
        with runtime.database(name).connection() as conn:
            total += len(store.retry_failed(conn, name, row_id))
    if row_id is not None and total == 0:
        raise click.BadParameter(f"no failed outbox row {row_id}", param_hint="ROW_ID")
    click.echo(f"{total} row(s) back to pending")


@outbox_group.command("dead-letters")
@_service_option
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@_json_option
def dead_letters_command(services: tuple[str, ...], limit: int, as_json: bool) -> None:
    """Messages the workers refused (undecodable, invalid, failing every retry), newest first."""
    from actors import runtime

    found = []
    for name in _services(services):
        with runtime.database(name).connection() as conn:
            found += [{"service": name, **row} for row in inbox.list_dead_letters(conn, name, limit)]
    if as_json:
        click.echo(json.dumps(found, default=str))
        return
    for row in found:
        click.echo(f"{row['service']} #{row['id']} {row['created_at']:%Y-%m-%d %H:%M:%S} {row['reason']}")
    if not found:
        click.echo("no dead letters")


def _asdict(value: Any) -> dict[str, Any]:
    import attrs

    return attrs.asdict(value)


COMMANDS = [outbox_group]
