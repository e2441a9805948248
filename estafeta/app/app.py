"""Apps: services assembled, and the one call that binds them to a broker.

An :class:`App` assembles services (:class:`~estafeta.app.service.Service`) and may include
other apps, whose steps its messages can reach; :meth:`App.bind` declares every step as a
Dramatiq actor on a broker (:mod:`estafeta.app.binding` does the declaring) and returns
the :class:`Binding`. Nothing here reads the environment or touches a broker until
``bind`` is called.

Dependencies point one way: this module imports the service's and the binding's, and
neither imports it (a service sees its app as :class:`~estafeta.app.service.ServiceApp`,
the binding as :class:`~estafeta.app.binding.Bindable`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from estafeta.app.binding import bind_app, bind_from_env
from estafeta.app.service import Service
from estafeta.schedules.spec import Schedule
from estafeta.steps.spec import StepSpec

if TYPE_CHECKING:
    import dramatiq

    from estafeta.app.runtime import Runtime
    from estafeta.app.settings import Settings
    from estafeta.sagas.saga import Saga


class App:
    """An app: services (their schemas, queues and steps) and the sagas they orchestrate.

    ``include`` adds other apps whose steps this app's messages may reach and whose
    services its workers also serve (a test app around the order system, say); each
    service keeps routing through the app that declared it.
    """

    def __init__(self, name: str, *, services: Sequence[Service], include: Sequence[App] = ()) -> None:
        self.name = name
        self._own = list(services)
        self.include = list(include)
        names = [s.name for s in self.services]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"app {name}: two services named {duplicates[0]!r}")
        for service in self._own:
            service._join(self)
        self._env_binding: Binding | None = None

    def __repr__(self) -> str:
        return f"App({self.name!r}, services={self.service_names})"

    @property
    def services(self) -> list[Service]:
        """Every service of the app and of the apps it includes (each once)."""
        found: dict[str, Service] = {}
        for app in self.include:
            for service in app.services:
                found.setdefault(service.name, service)
        for service in self._own:
            found.setdefault(service.name, service)
        return list(found.values())

    @property
    def service_names(self) -> list[str]:
        """The names (schemas) of :attr:`services`."""
        return [s.name for s in self.services]

    def service(self, name: str) -> Service:
        """The service called ``name``; ``KeyError`` naming the known ones otherwise."""
        for service in self.services:
            if service.name == name:
                return service
        raise KeyError(f"no service {name!r} in app {self.name} (known: {', '.join(self.service_names)})")

    @property
    def steps(self) -> dict[str, StepSpec]:
        """Every step by actor name."""
        return {actor: spec for service in self.services for actor, spec in service.steps.items()}

    @property
    def sagas(self) -> list[Saga]:
        """Every saga kind of the app."""
        return [saga for service in self.services for saga in service.sagas]

    @property
    def schedules(self) -> list[Schedule]:
        """Every recurring schedule of the app's services."""
        return [schedule for service in self.services for schedule in service.schedules]

    def schedule(self, name: str) -> Schedule:
        """The schedule ``name`` (``service.name``, or its bare name if unambiguous); ``KeyError`` otherwise."""
        found = [s for s in self.schedules if name in (s.full_name, s.name)]
        if len(found) == 1:
            return found[0]
        known = ", ".join(s.full_name for s in self.schedules) or "none"
        if found:
            raise KeyError(f"schedule name {name!r} is ambiguous in app {self.name}: say service.name ({known})")
        raise KeyError(f"no schedule {name!r} in app {self.name} (declared: {known})")

    def saga(self, name: str | None = None) -> Saga:
        """The saga kind ``name`` (or the only one); ``KeyError`` naming the known ones otherwise."""
        sagas = {saga.name: saga for saga in self.sagas}
        if name is None and len(sagas) == 1:
            return next(iter(sagas.values()))
        if name in sagas:
            return sagas[name]
        known = ", ".join(sorted(sagas)) or "none"
        raise KeyError(f"no saga kind {name!r} in app {self.name} (declared: {known})")

    def handlers(self, kind: type) -> list[StepSpec]:
        """The steps handling messages of type ``kind``."""
        return [spec for spec in self.steps.values() if spec.handles is kind]

    def bind(
        self,
        broker: dramatiq.Broker | None = None,
        runtime: Runtime | None = None,
        *,
        watchdog: bool = True,
        projectors: bool = True,
    ) -> Binding:
        """Declare every step of the app as a Dramatiq actor on ``broker``, run with ``runtime``.

        - ``app.bind()``, the call a worker module makes for ``dramatiq <module>``: the
          runtime comes from the ``ESTAFETA_*`` settings and the broker from
          ``ESTAFETA_BROKER_URL``; a bad setting stops the process with one line naming
          the variable (exit code 2). A second call returns the same binding.
        - ``app.bind(StubBroker(), runtime)`` in tests: a fresh broker each time.

        Either way the broker becomes Dramatiq's global broker, carries the middleware
        steps need (and, for an app with sagas, the saga watchdog that runs in each worker
        process; for an app with schedules, the scheduler that fires their ticks in each
        worker process, each tick once; ``watchdog=False`` leaves both out; for an app with
        projections, its projectors, one active per projection across all processes), and
        ``dramatiq`` workers consume one queue per service.
        """
        if broker is None and runtime is None:
            if self._env_binding is None:
                self._env_binding = Binding(self, *bind_from_env(self, watchdog=watchdog, projectors=projectors))
            return self._env_binding
        return Binding(self, *bind_app(self, broker, runtime, watchdog=watchdog, projectors=projectors))

    def migrate(self, runtime: Runtime, *, check: bool = False) -> dict[str, list[str]]:
        """Apply (or, with ``check``, only list) the pending migrations of every service, by service."""
        return runtime.migrate(self.services, check=check)


@attrs.frozen
class Binding:
    """An app bound to a broker: what its workers, its relay and its CLI run with."""

    app: App
    #: The broker every step is declared on (Dramatiq's global broker).
    broker: dramatiq.Broker
    #: Settings, pools and the lock backend of this process.
    runtime: Runtime
    #: The declared actors, by name (``<service>.<step>``).
    actors: Mapping[str, dramatiq.Actor[..., None]]

    @property
    def settings(self) -> Settings:
        """The runtime's settings."""
        return self.runtime.settings


def load_app(spec: str) -> App:
    """The :class:`App` named by ``spec``: ``package.module`` (its ``app``, or its only App) or ``module:attribute``.

    Raises ``LookupError`` with a one-line reason when the module cannot be imported or
    holds no app.
    """
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise LookupError(f"cannot import {module_name!r}: {exc}") from None
    if attribute:
        found = getattr(module, attribute, None)
        if not isinstance(found, App):
            raise LookupError(f"{module_name} has no App named {attribute!r}")
        return found
    if isinstance(getattr(module, "app", None), App):
        return module.app  # type: ignore[no-any-return]
    apps = {id(v): v for v in vars(module).values() if isinstance(v, App)}
    if len(apps) != 1:
        raise LookupError(f"{module_name} defines {len(apps)} Apps: name one as {module_name}:ATTRIBUTE")
    return next(iter(apps.values()))
