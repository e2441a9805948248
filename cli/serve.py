"""``estafeta serve``: the app's HTTP API, ``/health`` and the operator console, on uvicorn."""

from __future__ import annotations

import importlib
import socket
from datetime import timedelta
from typing import TYPE_CHECKING

import attrs
import click

from estafeta.app.clock import warn_if_moved
from estafeta.observability.heartbeats import Kind, app_heartbeat

from . import listen
from .context import AppContext, current
from .migrated import require_migrated

if TYPE_CHECKING:
    from fastapi import FastAPI

#: What ``estafeta serve`` imports, and the extra that installs it.
_NEEDS = ("fastapi", "uvicorn", "jinja2")


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="The port to listen on.")
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Let the console retry failed outbox rows, replay dead letters and resume or abort sagas (read-only"
    " without it); needs ESTAFETA_CONSOLE_PASSWORD or ESTAFETA_CONSOLE_PASSWORD_FILE.",
)
@click.option(
    "--console-port",
    type=click.IntRange(1, 65535),
    help="Serve the console on a listener of its own, on this port: --port then serves no /console.",
)
@click.option(
    "--console-host", default="127.0.0.1", show_default=True, help="Address the console's own listener listens on."
)
@click.option(
    "--idempotency-ttl",
    type=click.FloatRange(min=1),
    default=86_400,
    show_default=True,
    help="Seconds an Idempotency-Key's record answers repeats of its request.",
)
@click.option(
    "--client-header",
    default="X-Client-Id",
    show_default=True,
    help="Request header naming the authenticated client (set by your gateway); keys are scoped per client.",
)
@click.option(
    "--prune-interval",
    type=click.FloatRange(min=0.1),
    default=300,
    show_default=True,
    help="Seconds between passes deleting expired Idempotency-Key records, in batches.",
)
@click.option("--access-log/--no-access-log", default=True, show_default=True, help="Log every request.")
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    help="Serve Prometheus metrics (the console's refused sign-ins among them) on this port.",
)
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address the metrics server listens on.")
def serve_command(
    host: str,
    port: int,
    allow_actions: bool,
    console_port: int | None,
    console_host: str,
    idempotency_ttl: float,
    client_header: str,
    prune_interval: float,
    access_log: bool,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Serve the app over HTTP until SIGTERM: its API (the order API for the order system), /health, /console.

    POST /orders needs an Idempotency-Key header: the order, its saga, its first command
    and the key's record commit in one transaction. The OpenAPI document is at
    /openapi.json. The console at /console shows outboxes, dead letters and sagas; it
    acts only with --allow-actions, which needs the operator password
    (ESTAFETA_CONSOLE_PASSWORD or ESTAFETA_CONSOLE_PASSWORD_FILE; asked by HTTP Basic auth).
    --console-port serves the console on a listener of its own. Run several behind a load
    balancer for more.
    """
    missing = _missing()
    if missing:
        raise click.UsageError(f"needs {', '.join(missing)}: pip install 'estafeta[http]'")
    if console_port is None and click.get_current_context().get_parameter_source("console_host") not in _DEFAULTS:
        raise click.BadParameter("means nothing without --console-port: give both", param_hint="--console-host")
    context = current()
    listener = _listener(context, allow_actions, port, console_port)
    require_migrated(context)
    warn_if_moved(context.runtime, context.app.service_names, "serve")
    web = build(context, allow_actions, timedelta(seconds=idempotency_ttl), client_header, prune_interval, listener)
    console = f"http://{console_host}:{console_port}/console" if console_port else "/console"
    sockets = [listen.bind(host, port)]
    if console_port is not None:
        sockets.append(
            listen.bind(console_host, console_port, host_option="--console-host", port_option="--console-port")
        )
    if metrics_port is not None:
        _serve_metrics(metrics_host, metrics_port)
    click.echo(f"estafeta: serving {context.app.name} on http://{host}:{port} (console: {console})", err=True)
    serving: dict[str, list[str]] = {name: [] for name in context.app.service_names}
    with app_heartbeat(Kind.SERVE, serving, context.runtime):
        _run(web, sockets, access_log)


#: How an option left at its default was set (not by the user).
_DEFAULTS = (click.core.ParameterSource.DEFAULT, click.core.ParameterSource.DEFAULT_MAP)


def _listener(context: AppContext, allow_actions: bool, port: int, console_port: int | None) -> WebListener:
    """The console's listener and password; a usage error when actions have no password to guard them."""
    if console_port == port:
        raise click.BadParameter(
            f"{port} is also --port: give the console a port of its own", param_hint="--console-port"
        )
    password = context.runtime.settings.console_password
    if allow_actions and not password:
        raise click.UsageError(
            "--allow-actions needs an operator password: set ESTAFETA_CONSOLE_PASSWORD"
            " (or ESTAFETA_CONSOLE_PASSWORD_FILE naming a file that holds it)"
        )
    return WebListener(port=console_port, password=password)


def _run(web: FastAPI, sockets: list[socket.socket], access_log: bool) -> None:
    """Serve ``web`` on uvicorn until SIGTERM, on ``sockets`` (bound already: the API's, then the console's).

    One server, two listeners: the console's requests are told apart by the port they came in on.
    """
    import uvicorn

    config = uvicorn.Config(web, access_log=access_log, log_level="info", server_header=False)
    uvicorn.Server(config).run(sockets=sockets)


def _serve_metrics(host: str, port: int) -> None:
    """Prometheus metrics on ``host``:``port``, its socket bound first (a busy port is a usage error)."""
    from prometheus_client import start_http_server

    listen.bind(host, port, host_option="--metrics-host", port_option="--metrics-port").close()
    start_http_server(port, addr=host)


@attrs.frozen
class WebListener:
    """Who may reach the console: its own port (``None``: the API's), and the operator's password."""

    port: int | None = None
    password: str | None = attrs.field(default=None, repr=False)


def build(
    context: AppContext,
    allow_actions: bool,
    ttl: timedelta,
    client_header: str,
    prune_interval: float,
    listener: WebListener | None = None,
) -> FastAPI:
    """The ASGI app: the order API when the app is the order system, /health and the console always."""
    from estafeta_console.server.web import WebOptions, create_app

    runtime = context.runtime
    routers, pruners = [], []
    if context.is_order_system:
        from estafeta_actors.http import ApiOptions, OrderApi

        api = OrderApi(runtime, ApiOptions(idempotency_ttl=ttl, client_header=client_header))
        routers.append(api.router)
        pruners.append(lambda: api.keys.prune(runtime))
    listener = listener or WebListener()
    options = WebOptions(
        allow_actions=allow_actions,
        prune_interval=prune_interval,
        console_password=listener.password,
        console_port=listener.port,
    )
    return create_app(context.app, runtime, options, routers=routers, pruners=pruners)


def _missing() -> list[str]:
    missing = []
    for name in _NEEDS:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


COMMANDS = [serve_command]
