"""``estafeta``: the command group, and the one place errors become one line and an exit code."""

from __future__ import annotations

import logging
import sys

import click

from estafeta import DatabaseRefused, EstafetaError, StatementFailed, __version__
from estafeta.observability import logs as logs

from .context import ORDER_SYSTEM, AppContext
from .migrated import as_not_migrated

#: Exit codes: bad input, and an operation that failed.
EXIT_USAGE = 2
EXIT_FAILURE = 1


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="estafeta", message="%(prog)s %(version)s")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option(
    "--app",
    "app_spec",
    envvar="ESTAFETA_APP",
    default=ORDER_SYSTEM,
    show_default=True,
    metavar="MODULE[:NAME]",
    help="The app to work on: a module defining an estafeta App (its `app`, or NAME) [ESTAFETA_APP].",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    envvar="ESTAFETA_LOG_FORMAT",
    default="text",
    show_default=True,
    help="Log lines as text, or one JSON object per line [ESTAFETA_LOG_FORMAT].",
)
@click.pass_context
def cli(ctx: click.Context, verbose: int, app_spec: str, log_format: str) -> None:
    """estafeta: transactional outbox, idempotent inbox, sagas and fenced locks for Dramatiq.

    Runtime commands (migrate, relay, outbox, sagas, prune, dead-letters) work on any app; seed, orders, demo
    and ping belong to the order system, the default app. Configuration comes from
    ESTAFETA_* environment variables (see docs/reference/settings.md); the default is an embedded
    PostgreSQL and the in-memory StubBroker.
    """
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    logs.configure(level, log_format)
    logs.quiet_pika(level)
    if not verbose:
        # The pool logs every failed reconnection; the command reports the outcome in one line.
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    ctx.obj = AppContext(app_spec)


def _register() -> None:
    from . import (
        dead_letters,
        demo,
        migrate,
        orders,
        outbox,
        ping,
        projections,
        prune,
        queues,
        relay,
        sagas,
        schedules,
        seed,
        serve,
        status,
    )

    modules = (
        migrate,
        outbox,
        ping,
        relay,
        seed,
        orders,
        sagas,
        schedules,
        projections,
        demo,
        prune,
        dead_letters,
        serve,
        queues,
        status,
    )
    for module in modules:
        for command in module.COMMANDS:
            cli.add_command(command)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: bad input is one line on stderr and exit code 2, never a traceback."""
    _register()
    try:
        code = cli.main(args=argv, prog_name="estafeta", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        code = 0
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "estafeta"
        click.echo(f"{where}: {exc.format_message()}", err=True)
        code = EXIT_USAGE
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.Abort:
        click.echo("aborted", err=True)
        code = 130
    except click.ClickException as exc:
        click.echo(f"estafeta: {exc.format_message()}", err=True)
        code = exc.exit_code
    except DatabaseRefused as exc:  # configuration, not an outage: the URL, the role or the database to fix
        click.echo(f"estafeta: {exc}", err=True)
        code = EXIT_USAGE
    except StatementFailed as exc:  # a command that reads tables of a database not migrated says so
        click.echo(f"estafeta: {as_not_migrated(exc) or exc}", err=True)
        code = EXIT_FAILURE
    except EstafetaError as exc:
        click.echo(f"estafeta: {exc}", err=True)
        code = EXIT_FAILURE
    except KeyboardInterrupt:
        code = 130
    sys.exit(code if isinstance(code, int) else 0)
