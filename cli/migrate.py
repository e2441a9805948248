"""``estafeta migrate``: apply the app's schema migrations."""

from __future__ import annotations

import click

from .context import current


@click.command("migrate")
@click.option("--check", is_flag=True, help="Apply nothing; exit 1 while a migration is pending.")
@click.option("--service", "services", multiple=True, help="Only this service (repeatable).")
def migrate_command(check: bool, services: tuple[str, ...]) -> None:
    """Create or update every service's schema (safe to run twice, or from several processes)."""
    context = current()
    chosen = [context.app.service(name) for name in context.services(services)]
    result = context.runtime.migrate(chosen, check=check)
    for service, names in result.items():
        verb = "pending" if check else "applied"
        click.echo(f"{service}: {verb} {len(names)}" + (f" ({', '.join(names)})" if names else ""))
    if check and any(result.values()):
        raise click.exceptions.Exit(1)


COMMANDS = [migrate_command]
