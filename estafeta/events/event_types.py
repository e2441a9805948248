"""Event types: names, schema versions, upcasters, and the JSON form of events.

Events are attrs classes carried as JSON by the converter of commands (``_messages``): UUIDs
and Decimals as strings, datetimes in ISO 8601. Every stored event carries its type's name and
the schema version it was written in; readers see only the current version, because
upcasters (``v1 -> v2 -> v3``) rewrite older data on read. :meth:`EventRegistry.check`
refuses, at start-up, a chain with a gap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import cattrs

from estafeta.messaging.messages import converter
from estafeta_sql.errors import EstafetaError

T = TypeVar("T")

#: Rewrites the data of one schema version into the next one's.
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


class EventRegistryError(EstafetaError):
    """The event types or their upcasters are inconsistent."""


class EventDecodeError(EstafetaError):
    """A stored event cannot be turned into its current class."""


class UnknownEventType(EventDecodeError):
    """No event class is registered under the stored type name."""


class UnknownSchemaVersion(EventDecodeError):
    """The stored schema version is newer than the code knows, or older than the type's first."""


class InvalidEventData(EventDecodeError):
    """The stored data (after upcasting) does not fit the event class."""


@attrs.frozen
class EventType:
    """A registered event class: its stored name and current schema version."""

    name: str
    cls: type
    #: The schema version new events are written in; older ones are upcast to it on read.
    version: int
    #: The oldest schema version that ever existed (no upcaster is needed below it).
    since: int = 1


class EventRegistry:
    """The event types of an app (or a service), by class and by stored name.

    Not a process-global: an app creates one and hands it to its stores, projections and
    repositories. Registration happens once, at start-up; reads need no lock.
    """

    def __init__(self) -> None:
        self._by_name: dict[str, EventType] = {}
        self._by_class: dict[type, EventType] = {}
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        self._problems: list[str] = []

    def event(self, name: str | None = None, *, version: int = 1, since: int = 1) -> Callable[[type[T]], type[T]]:
        """Class decorator: register an attrs class as the event type ``name`` (default: the class name)."""

        def decorate(cls: type[T]) -> type[T]:
            self.register(cls, name, version=version, since=since)
            return cls

        return decorate

    def register(self, cls: type, name: str | None = None, *, version: int = 1, since: int = 1) -> EventType:
        """Register ``cls`` as the event type ``name`` at schema ``version``; refuse a name or class twice."""
        if not attrs.has(cls):
            raise EventRegistryError(f"{cls.__qualname__} is not an attrs class; events must be")
        if not 1 <= since <= version:
            raise EventRegistryError(f"{cls.__qualname__}: need 1 <= since ({since}) <= version ({version})")
        entry = EventType(name or cls.__name__, cls, version, since)
        for key, table in ((entry.name, self._by_name), (cls, self._by_class)):
            if key in table:
                raise EventRegistryError(f"event type {entry.name!r} ({cls.__qualname__}) is registered twice")
        self._by_name[entry.name] = entry
        self._by_class[cls] = entry
        return entry

    def upcaster(self, name: str, *, from_version: int) -> Callable[[Upcaster], Upcaster]:
        """Decorator: ``fn(data) -> data`` rewrites ``name`` events from ``from_version`` to the next version."""

        def decorate(fn: Upcaster) -> Upcaster:
            self.add_upcaster(name, from_version, fn)
            return fn

        return decorate

    def add_upcaster(self, name: str, from_version: int, fn: Upcaster) -> None:
        """Register ``fn`` as the upcaster of ``name`` from ``from_version`` to ``from_version + 1``."""
        if (name, from_version) in self._upcasters:
            raise EventRegistryError(f"two upcasters of {name!r} from version {from_version}")
        self._upcasters[name, from_version] = fn

    def check(self) -> None:
        """Raise :class:`EventRegistryError` naming every gap or stray link in the upcaster chains."""
        problems: list[str] = []
        for entry in self._by_name.values():
            for version in range(entry.since, entry.version):
                if (entry.name, version) not in self._upcasters:
                    problems.append(
                        f"{entry.name}: no upcaster from version {version} to {version + 1}"
                        f" (the type is at version {entry.version})"
                    )
        for name, version in sorted(self._upcasters):
            target = self._by_name.get(name)
            if target is None:
                problems.append(f"an upcaster of {name!r} from version {version}, but no such event type")
            elif not target.since <= version < target.version:
                problems.append(
                    f"{name}: an upcaster from version {version}, outside {target.since}..{target.version - 1}"
                )
        if problems:
            raise EventRegistryError("; ".join(problems))

    def type_of(self, event: object) -> EventType:
        """The registered type of ``event``; :class:`EventRegistryError` if its class is not registered."""
        entry = self._by_class.get(type(event))
        if entry is None:
            raise EventRegistryError(f"{type(event).__qualname__} is not a registered event type")
        return entry

    def named(self, name: str) -> EventType | None:
        """The type registered under ``name``, if any."""
        return self._by_name.get(name)

    def names_of(self, classes: tuple[type, ...] | list[type]) -> list[str]:
        """The stored names of ``classes``, each of which must be registered."""
        missing = [cls.__qualname__ for cls in classes if cls not in self._by_class]
        if missing:
            raise EventRegistryError(f"not registered event types: {', '.join(missing)}")
        return [self._by_class[cls].name for cls in classes]

    def encode(self, event: object) -> tuple[EventType, dict[str, Any]]:
        """``event``'s registered type and its JSON-ready data (in the current schema version)."""
        entry = self.type_of(event)
        data = converter.unstructure(event)
        assert isinstance(data, dict)
        return entry, data

    def decode(self, name: str, schema_version: int, data: Any) -> Any:
        """The current-version event for stored ``data`` of type ``name`` written at ``schema_version``.

        Raises :class:`UnknownEventType`, :class:`UnknownSchemaVersion` or
        :class:`InvalidEventData` with a one-line reason.
        """
        entry = self._by_name.get(name)
        if entry is None:
            raise UnknownEventType(f"unknown event type {name!r}")
        if not entry.since <= schema_version <= entry.version:
            raise UnknownSchemaVersion(
                f"{name} schema version {schema_version} is unknown here (this code reads"
                f" {entry.since}..{entry.version}; was it written by a newer release?)"
            )
        if not isinstance(data, dict):
            raise InvalidEventData(f"{name} v{schema_version}: expected a JSON object, got {type(data).__name__}")
        for version in range(schema_version, entry.version):
            data = self._upcast(name, version, data)
        return _structure(entry, data)

    def _upcast(self, name: str, version: int, data: dict[str, Any]) -> dict[str, Any]:
        upcast = self._upcasters.get((name, version))
        if upcast is None:
            raise UnknownSchemaVersion(f"{name}: no upcaster from version {version} to {version + 1}")
        try:
            result = upcast(dict(data))
        except Exception as exc:
            raise InvalidEventData(f"{name}: the upcaster from version {version} failed: {exc!r}") from exc
        if not isinstance(result, dict):
            raise InvalidEventData(f"{name}: the upcaster from version {version} returned {type(result).__name__}")
        return result


def _structure(entry: EventType, data: dict[str, Any]) -> Any:
    try:
        return converter.structure(data, entry.cls)
    except Exception as exc:
        details = cattrs.transform_error(exc) if isinstance(exc, cattrs.BaseValidationError) else [str(exc)]
        raise InvalidEventData(f"not a valid {entry.name} v{entry.version}: {'; '.join(details)}") from None
