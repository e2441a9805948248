"""``estafeta prune``: delete what the retention settings no longer keep."""

from __future__ import annotations

import json

import click

from estafeta.operations.retention import Retention, prune

from .context import current
from .migrated import require_migrated


@click.command("prune")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--service", "services", multiple=True, help="Only this service (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def prune_command(dry_run: bool, services: tuple[str, ...], as_json: bool) -> None:
    """Delete inbox records, delivery counts, dead letters, fence rows and ended sagas' logs past their retention.

    Retention comes from ESTAFETA_INBOX_RETENTION (7d), ESTAFETA_DEAD_LETTER_RETENTION
    (7d, never longer than the inbox's), ESTAFETA_FENCE_RETENTION (1d) and
    ESTAFETA_SAGA_LOG_RETENTION (30d). Rows go a batch at a time (ESTAFETA_PRUNE_BATCH_SIZE),
    each batch a short transaction of its own that skips rows in use: safe while workers
    run. Every worker already prunes every ESTAFETA_PRUNE_INTERVAL (1h; 0 turns it off).
    A table that cannot be pruned (missing, locked for more than 5 s, its database down) is
    reported on stderr with the reason, the others are pruned, and the exit code is 1.
    """
    context = current()
    runtime = context.runtime
    names = context.services(services)
    chosen = [s for s in context.app.services if s.name in names]
    sagas = [saga for saga in context.app.sagas if saga.service in names]
    require_migrated(context, chosen)
    report = prune(runtime, chosen, sagas, retention=Retention.from_settings(runtime.settings), dry_run=dry_run)
    if as_json:
        click.echo(json.dumps(report.counts))
    else:
        verb = "would delete" if dry_run else "deleted"
        for service, tables in report.counts.items():
            if not tables:
                continue
            counts = ", ".join(f"{table} {n}" for table, n in tables.items())
            click.echo(f"{service}: {verb} {counts}")
    failed = [(service, table, why) for service, tables in report.failures.items() for table, why in tables.items()]
    for service, table, why in failed:
        click.echo(f"{service}.{table}: not pruned: {why}", err=True)
    if failed:
        raise click.ClickException(f"{len(failed)} table(s) not pruned (above); the others were; run again once fixed")


COMMANDS = [prune_command]
