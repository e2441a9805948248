"""The catalogue of declared steps: which actor handles which command or event type.

Declaring a step only records it here. Binding to a broker happens separately
(:func:`actors.step.bind`), so tests can bind every step to a fresh StubBroker and
nothing stays tied to an old one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs


@attrs.frozen
class StepSpec:
    """A declared step: a function run once per message, in one transaction."""

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

    @property
    def actor_name(self) -> str:
        """``<service>.<name>``: unique on any broker."""
        return f"{self.service}.{self.name}"

    @property
    def queue_name(self) -> str:
        """Every step of a service shares the service's queue."""
        return self.service

    def __call__(self, ctx: Any, command: Any) -> Any:
        """Run the step's function directly (unit tests of business logic)."""
        return self.fn(ctx, command)


class Registry:
    """Declared steps by actor name, and the steps handling each message type."""

    def __init__(self) -> None:
        self._steps: dict[str, StepSpec] = {}

    def add(self, spec: StepSpec) -> None:
        """Record ``spec``; a second step with the same actor name is an error."""
        existing = self._steps.get(spec.actor_name)
        if existing is not None and existing.fn is not spec.fn:
            raise ValueError(f"a step named {spec.actor_name!r} is already declared")
        self._steps[spec.actor_name] = spec

    def handlers(self, kind: type) -> list[StepSpec]:
        """The steps handling messages of type ``kind``."""
        return [spec for spec in self._steps.values() if spec.handles is kind]

    def get(self, actor_name: str) -> StepSpec:
        """The step called ``actor_name``."""
        return self._steps[actor_name]

    def steps(self) -> Mapping[str, StepSpec]:
        """Every declared step by actor name."""
        return dict(self._steps)


#: Every step declared in this process.
REGISTRY = Registry()
