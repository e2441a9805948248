"""The app a command works on (``--app`` / ``ESTAFETA_APP``), loaded and bound only when a command needs it."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import click

from estafeta import App, Binding, load_app
from estafeta.app.middleware import embedded_notice

if TYPE_CHECKING:
    import dramatiq

    from estafeta import Runtime, Saga

#: The app ``estafeta`` works on when neither ``--app`` nor ``ESTAFETA_APP`` names one.
ORDER_SYSTEM = "estafeta_actors"


class AppContext:
    """What ``--app`` named: the module, then (on first use) its app and its binding."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._app: App | None = None
        #: What the embedded database's notice calls this process (the command, unless it says).
        self.notice_as: str | None = None
        self._noticed = False

    @property
    def app(self) -> App:
        """The app, imported on first use (a module that cannot be imported is a usage error)."""
        if self._app is None:
            # As `dramatiq` does (its --path defaults to "."): an app module in the current
            # directory is found without PYTHONPATH.
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())
            try:
                self._app = load_app(self.spec)
            except LookupError as exc:
                raise click.BadParameter(str(exc), param_hint="--app") from None
        return self._app

    @property
    def binding(self) -> Binding:
        """The app bound to the broker of the ``ESTAFETA_*`` settings (the one its module bound, if it did)."""
        return self.app.bind()

    @property
    def runtime(self) -> Runtime:
        """Settings, pools and locks of this process (each database's first use fails fast on a refusal)."""
        runtime = self.binding.runtime
        runtime.connect_first = True
        if runtime.embedded and not self._noticed:
            # Every command on the embedded database says so: its answers come from a private
            # PostgreSQL in this directory, not from the database the user may have meant.
            self._noticed = True
            click.echo(embedded_notice(self.notice_as or f"command ({_command_path()})"), err=True)
        return runtime

    @property
    def broker(self) -> dramatiq.Broker:
        """The app's broker."""
        return self.binding.broker

    @property
    def is_order_system(self) -> bool:
        """Whether the app is estafeta's own order system (``actors``)."""
        return self.spec.partition(":")[0] == ORDER_SYSTEM

    def services(self, names: tuple[str, ...] | list[str] = ()) -> list[str]:
        """``names`` checked against the app's services (all of them when empty)."""
        known = self.app.service_names
        for name in names:
            if name not in known:
                raise click.BadParameter(f"no service {name!r} (known: {', '.join(known)})", param_hint="--service")
        return list(names) or known

    def saga(self, kind: str | None) -> Saga:
        """The saga kind ``kind`` (or the app's only one)."""
        try:
            return self.app.saga(kind)
        except KeyError as exc:
            raise click.BadParameter(str(exc.args[0]), param_hint="--saga") from None


def _command_path() -> str:
    found = click.get_current_context(silent=True)
    return found.command_path if found is not None else "estafeta"


def current() -> AppContext:
    """The context of the running ``estafeta`` command."""
    found = click.get_current_context().find_object(AppContext)
    if found is None:  # a command invoked outside the group (tests)
        found = AppContext(ORDER_SYSTEM)
    return found


def order_system() -> AppContext:
    """The context, refusing (exit code 2) when the app is not the order system."""
    context = current()
    if not context.is_order_system:
        command = click.get_current_context().command_path
        raise click.UsageError(
            f"`{command}` belongs to estafeta's order system (--app {ORDER_SYSTEM}), not to --app {context.spec}"
        )
    return context
