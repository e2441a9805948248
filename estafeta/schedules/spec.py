"""Recurring schedules as declared: when their ticks fall, and what each tick sends.

``@service.schedule("*/5 * * * *", tz="Europe/Madrid")`` or
``@service.schedule(every=timedelta(minutes=5))`` decorates ``fn(tick)``, which returns
the command to send for the tick (or ``None`` to send nothing). The firing itself (one
transaction per due schedule, in any worker process) is :mod:`estafeta.schedules.scheduler`'s.

Cron expressions are read by cronsim (healthchecks.io's parser): small, typed, without
dependencies, and with Debian cron's documented behaviour across daylight-saving changes,
which this module keeps (see :class:`Cron`). croniter, the older choice, was declared
abandoned by its maintainer in 2024-25 before pallets-eco took it over; cronsim has been
maintained throughout and is what several of croniter's users moved to.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs
from cronsim import CronSim, CronSimError

from estafeta_sql.errors import EstafetaError

if TYPE_CHECKING:
    from estafeta.steps.spec import Router

#: The namespace of tick message ids: uuid5(namespace, "service.name@tick") is one id per tick.
TICK_NAMESPACE = uuid.UUID("5b0e3d4c-6c0e-4c55-9a1f-0d3f7c1a2b61")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Overlap(enum.Enum):
    """What a tick does while the message the previous firing sent is not handled yet."""

    #: Not fired (counted as skipped) until the previous run is finished.
    SKIP = "skip"
    #: Fired anyway: runs may overlap.
    ALLOW = "allow"


class CatchUp(enum.Enum):
    """Which of the ticks that fell due while nothing fired (downtime, a pause) are fired late."""

    #: Every missed tick, oldest first.
    ALL = "all"
    #: Only the latest one; the others are counted as missed.
    LAST = "last"
    #: None: a tick later than the grace period is counted as missed, not fired.
    NONE = "none"


class Timing(Protocol):
    """When a schedule's ticks fall."""

    @property
    def spec(self) -> str:
        """What the stored row was computed from; a changed spec restarts the schedule."""

    def next_after(self, when: datetime) -> datetime:
        """The first tick strictly after ``when`` (an aware instant; returned in UTC)."""

    def latest_through(self, when: datetime) -> datetime:
        """The last tick at or before ``when`` (returned in UTC)."""


@attrs.frozen
class Every:
    """A tick every ``interval``, at whole multiples of it since 1970-01-01 00:00 UTC.

    ``every=timedelta(hours=1)`` ticks at the top of each UTC hour, whichever process
    registered the schedule when: the ticks do not depend on when it started.
    """

    interval: timedelta

    @property
    def spec(self) -> str:
        return f"every {self.interval}"

    def next_after(self, when: datetime) -> datetime:
        steps = (when - _EPOCH) // self.interval + 1
        return _EPOCH + steps * self.interval

    def latest_through(self, when: datetime) -> datetime:
        return _EPOCH + ((when - _EPOCH) // self.interval) * self.interval


@attrs.frozen
class Cron:
    """The ticks of a cron expression in a time zone.

    Across daylight-saving changes it behaves as Debian's cron (cronsim's rules): a time
    that does not exist on the day the clocks go forward (02:30 in Madrid on the last
    Sunday of March) fires once, at the first instant after the gap (03:00); on the day
    they go back, an expression with a fixed hour (``30 2 * * *``) fires once, at the
    first of the two 02:30s, and one with a wildcard or stepped hour (``*/30 * * * *``)
    fires at both.
    """

    expression: str
    tz: str = "UTC"

    def __attrs_post_init__(self) -> None:
        try:
            zone = ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"schedule time zone {self.tz!r} is not an IANA time zone (e.g. Europe/Madrid)") from None
        try:
            CronSim(self.expression, datetime(2000, 1, 1, tzinfo=zone))
        except CronSimError as exc:
            raise ValueError(f"cron expression {self.expression!r}: {exc}") from None

    @property
    def spec(self) -> str:
        return f"cron {self.expression} {self.tz}"

    def next_after(self, when: datetime) -> datetime:
        # cronsim reads a local time in the hour repeated when the clocks go back as its
        # first occurrence, so its next time may be earlier than ``when``: skip those.
        for candidate in CronSim(self.expression, when.astimezone(ZoneInfo(self.tz))):
            if candidate.astimezone(UTC) > when:
                return candidate.astimezone(UTC)
        raise AssertionError("unreachable: a cron iterator never ends")

    def latest_through(self, when: datetime) -> datetime:
        # cronsim's reverse iterator reads the hour repeated when the clocks go back as one
        # hour, so its candidate there can be a tick of the day before, or a second 02:30 that
        # a fixed hour never fires. A candidate only says where to look: the ticks are those
        # next_after steps through, walked forward from a time before any repeated hour.
        zone = ZoneInfo(self.tz)
        for candidate in CronSim(self.expression, when.astimezone(zone), reverse=True):
            start = _outside_repeated_hours(candidate.astimezone(UTC) - timedelta(seconds=1), zone)
            tick = self.next_after(start)
            if tick > when:
                continue
            while (following := self.next_after(tick)) <= when:
                tick = following
            return tick
        raise AssertionError("unreachable: a cron iterator never ends")


def _outside_repeated_hours(when: datetime, zone: ZoneInfo) -> datetime:
    """``when``, or an hour before it until its wall time in ``zone`` happens once only."""
    while (local := when.astimezone(zone)).replace(fold=1 - local.fold).utcoffset() != local.utcoffset():
        when -= timedelta(hours=1)
    return when


class ScheduleService(Protocol):
    """The service a schedule is declared on (an :class:`estafeta.Service`), as the schedule and its scheduler see it.

    Only what firing a tick needs, so that the service's module, which declares schedules,
    and this one do not import each other.
    """

    @property
    def name(self) -> str:
        """The service's name: the schema of its schedules table, the outbox of the ticks' commands."""

    @property
    def router(self) -> Router:
        """Where a tick's command is routed: the service's app."""

    @property
    def schedules(self) -> list[Schedule]:
        """Every schedule the service declares."""


class Schedule:
    """A declared recurring schedule: when it ticks, what each tick sends, and its policies."""

    def __init__(
        self,
        service: ScheduleService,
        name: str,
        timing: Timing,
        fn: Callable[[datetime], Any],
        *,
        overlap: Overlap,
        catch_up: CatchUp,
        grace: timedelta,
    ) -> None:
        self.service = service
        #: Unique in its service: the row's key and the name the CLI takes (``service.name`` too).
        self.name = name
        self.timing = timing
        self.fn = fn
        self.overlap = overlap
        self.catch_up = catch_up
        #: How late a tick may fire under ``CatchUp.NONE`` and still count as on time.
        self.grace = grace

    def __repr__(self) -> str:
        return f"Schedule({self.full_name!r}, {self.timing.spec!r})"

    def __call__(self, tick: datetime) -> Any:
        """The command for ``tick`` (what the decorated function returns)."""
        return self.fn(tick)

    @property
    def full_name(self) -> str:
        """``<service>.<name>``."""
        return f"{self.service.name}.{self.name}"

    @property
    def spec(self) -> str:
        """The timing's spec, stored with the row."""
        return self.timing.spec

    def tick_message_id(self, tick: datetime) -> uuid.UUID:
        """The one message id of ``tick``: a tick written twice would be one outbox row, one inbox record."""
        return uuid.uuid5(TICK_NAMESPACE, f"{self.full_name}@{tick.astimezone(UTC).isoformat()}")

    def due_ticks(self, first: datetime, now: datetime, limit: int) -> tuple[list[datetime], bool]:
        """The ticks from ``first`` (a tick) up to ``now``, at most ``limit``; and whether more remain."""
        ticks: list[datetime] = []
        tick = first
        while tick <= now:
            if len(ticks) == limit:
                return ticks, True
            ticks.append(tick)
            tick = self.timing.next_after(tick)
        return ticks, False


def timing_of(cron: str | None, every: timedelta | None, tz: str) -> Timing:
    """The :class:`Timing` of a declaration: a cron expression (in ``tz``) or an interval, not both."""
    if (cron is None) == (every is None):
        raise ValueError("a schedule takes a cron expression or every=timedelta(...), exactly one of them")
    if every is not None:
        if every < timedelta(seconds=1) or every % timedelta(seconds=1):
            raise ValueError(f"schedule every={every!r}: give a whole number of seconds, at least one")
        return Every(every)
    assert cron is not None
    return Cron(cron, tz)


class DeclaredOtherwise(EstafetaError):
    """A schedule's stored row runs another declaration than this code's (an operator's checkout that differs)."""
