"""``estafeta migrate``: apply the services' schema migrations."""

from __future__ import annotations

import click


@click.command("migrate")
@click.option("--check", is_flag=True, help="Apply nothing; exit 1 while a migration is pending.")
@click.option("--service", "services", multiple=True, help="Only this service (repeatable).")
def migrate_command(check: bool, services: tuple[str, ...]) -> None:
    """Create or update every service's schema (safe to run twice, or from several processes)."""
    from actors import runtime
    from actors.services import all_services

    known = {s.name for s in all_services()}
    for name in services:
        if name not in known:
            raise click.BadParameter(f"no service {name!r} (known: {', '.join(sorted(known))})", param_hint="--service")
    result = runtime.migrate(list(services) or None, check=check)
    for service, names in result.items():
        verb = "pending" if check else "applied"
        click.echo(f"{service}: {verb} {len(names)}" + (f" ({', '.join(names)})" if names else ""))
    if check and any(result.values()):
        raise click.exceptions.Exit(1)


COMMANDS = [migrate_command]
