"""What a declared step is, and how a message type finds the step that handles it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs

from estafeta_sql.plan import Statement


@attrs.frozen
class StepSpec:
    """A declared step: a function run once per message, in one transaction of its service."""

    #: The owning service (its schema, queue and actor-name prefix).
    service: str
    #: The step's own name; the actor is ``<service>.<name>``.
    name: str
    #: The attrs class of the command or event it handles.
    handles: type
    #: ``fn(ctx, command)``; its return value (attrs, dict or None) answers a saga.
    fn: Callable[..., Any]
    #: A function of the command giving the key that serialises steps (``None``: no lock).
    lock: Callable[[Any], str] | None = None
    #: Dramatiq actor options overriding the settings (``max_retries``, ``min_backoff``...).
    actor_options: Mapping[str, Any] = attrs.field(factory=dict)
    #: The declaring service: the messages this step sends are routed through its app.
    owner: Owner | None = attrs.field(default=None, eq=False, repr=False)
    #: A function of the command giving a statement for the step's first round trip (or
    #: ``None``): its rows reach the function as ``ctx.opening`` (see ``Service.step``).
    opening: Callable[[Any], Statement | None] | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def actor_name(self) -> str:
        """``<service>.<name>``: unique on any broker."""
        return f"{self.service}.{self.name}"

    @property
    def queue_name(self) -> str:
        """Every step of a service shares the service's queue."""
        return self.service

    @property
    def router(self) -> Router:
        """The app that routes what this step sends."""
        if self.owner is None:
            raise RuntimeError(f"step {self.actor_name} was not declared on a Service")
        return self.owner.router

    def __call__(self, ctx: Any, command: Any) -> Any:
        """Run the step's function directly (unit tests of business logic)."""
        return self.fn(ctx, command)


class Router(Protocol):
    """Finds the steps that handle a message type (an app and the apps it includes)."""

    def handlers(self, kind: type) -> list[StepSpec]:
        """The steps handling messages of type ``kind``."""


class Owner(Protocol):
    """What declared a step: a service, which knows its app."""

    @property
    def router(self) -> Router:
        """The app of the service."""
