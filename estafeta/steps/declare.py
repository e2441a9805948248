"""Steps declared as Dramatiq actors: the actor's body runs one delivery, then the hand-offs it offered.

The body calls :func:`estafeta.steps.delivery.deliver`, whose transaction runs inside the
actor function (not in middleware hooks). Apart from the delivery: declaring an actor, retrying
it after a concurrency conflict and passing hand-offs on are the worker's, not the transaction's.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable
from typing import Any

import dramatiq
from dramatiq.middleware import CurrentMessage

from estafeta.app.runtime import Runtime
from estafeta.events.store import ConcurrencyConflict
from estafeta.messaging import handoff as handoff
from estafeta.observability import metrics as metrics
from estafeta.steps.delivery import deliver
from estafeta.steps.outcome import Outcome
from estafeta.steps.spec import StepSpec

# A delivery's log lines come from one logger, whichever module writes them: a logging
# configuration (and an operator's filter) names it.
logger = logging.getLogger("estafeta.steps.delivery")

#: First retry delay after a :class:`ConcurrencyConflict`, in milliseconds (doubling per retry).
_CONFLICT_BACKOFF_MS = 20


def declare_actors(
    broker: dramatiq.Broker, runtime: Runtime, specs: Iterable[StepSpec]
) -> dict[str, dramatiq.Actor[..., None]]:
    """Declare ``specs`` as actors on ``broker``, running with ``runtime``; return them by name.

    Steps already declared on ``broker`` are left as they are (binding an app twice to one
    broker declares nothing new).
    """
    if not any(isinstance(m, CurrentMessage) for m in broker.middleware):
        broker.add_middleware(CurrentMessage())
    if not any(isinstance(m, handoff.WorkerQueues) and m.runtime is runtime for m in broker.middleware):
        broker.add_middleware(handoff.WorkerQueues(runtime))
    settings = runtime.settings
    actors = {}
    for spec in specs:
        if spec.actor_name in broker.actors:
            continue
        options = {
            "max_retries": settings.max_retries,
            "min_backoff": settings.min_backoff_ms,
            "max_backoff": settings.max_backoff_ms,
            **spec.actor_options,
        }
        actors[spec.actor_name] = dramatiq.Actor(
            _actor_body(spec, runtime),
            broker=broker,
            actor_name=spec.actor_name,
            queue_name=spec.queue_name,
            priority=0,
            options=options,
        )
        runtime.steps_here[spec.actor_name] = spec
    return actors


def _actor_body(spec: StepSpec, runtime: Runtime) -> Callable[..., None]:
    def body(*args: Any, **kwargs: Any) -> None:
        message = CurrentMessage.get_current_message()
        if message is None:
            raise RuntimeError(f"{spec.actor_name} ran without the CurrentMessage middleware")
        handoff.take()
        try:
            deliver(spec, runtime, message)
        except ConcurrencyConflict as conflict:
            # Expected under contention (two steps saved one stream), and over as soon as
            # the other transaction ended: retried sooner than other errors (20 ms, doubling,
            # jittered), and an INFO line in the log (as Dramatiq logs expected errors), not a traceback.
            retries = int(message.options.get("retries", 0))
            delay = min(runtime.settings.max_backoff_ms, _CONFLICT_BACKOFF_MS * 2**retries)
            logger.info("%s: %s retried after a concurrency conflict: %s", spec.actor_name, message, conflict)
            raise dramatiq.Retry(str(conflict), delay=int(delay * random.uniform(0.5, 1.0))) from conflict
        _pass_on(runtime)

    body.__name__ = spec.name
    body.__qualname__ = spec.actor_name
    body.__module__ = getattr(spec.fn, "__module__", __name__)
    return body


def _pass_on(runtime: Runtime) -> None:
    """Run the hand-offs the delivery just done offered, at most ``ESTAFETA_HANDOFFS`` in a row (``messaging.handoff``).

    A hand-off that fails, or finds an older row of its key still to go, is the relays'
    again: its row is released and they are woken for it, as for one offered past the limit.
    """
    for _ in range(runtime.settings.handoffs):
        baton = handoff.take()
        if baton is None:
            return
        actor = baton.spec.actor_name
        try:
            outcome = deliver(baton.spec, runtime, baton.message, handoff_from=baton.schema)
        except Exception as exc:
            handoff.take()
            logger.info(
                "%s: hand-off of %s failed (%s: %s); a relay publishes it",
                actor,
                baton.message.message_id,
                type(exc).__name__,
                exc,
            )
            metrics.HANDOFFS.labels(actor, "failed").inc()
            _to_the_relays(runtime, baton)
            return
        if outcome is Outcome.RELAYED:
            metrics.HANDOFFS.labels(actor, "relayed").inc()
            _to_the_relays(runtime, baton)
            return
        metrics.HANDOFFS.labels(actor, "done").inc()
    baton = handoff.take()
    if baton is not None:
        _to_the_relays(runtime, baton)


def _to_the_relays(runtime: Runtime, baton: handoff.Baton) -> None:
    """Release a hand-off's row, due now, and wake the relays for it (a failure is logged: the lease ends anyway)."""
    try:
        handoff.release(baton)
    except Exception as exc:
        logger.warning(
            "%s: could not release hand-off %s (%s); the relays take it when its lease ends",
            baton.spec.actor_name,
            baton.message.message_id,
            exc,
        )
        return
    if runtime.settings.wakeup != "poll":
        runtime.wake_after_commit(baton.database, baton.schema)
