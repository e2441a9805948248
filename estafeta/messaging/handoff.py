"""Hand-offs (``ESTAFETA_HANDOFFS``): a step's one message run by the next step at once, in the same thread.

A saga step message normally goes the long way: its outbox row commits, a relay claims it,
publishes it and deletes it, the broker hands it to a worker, which decodes it and runs the
next step. When the step wrote exactly one message, due now, for a step this process has
declared on the same database, the worker thread can run that step itself right after the
commit. The row stays the message's only record, written *leased* (``LEASE``: no relay
claims it before the lease ends, and it holds back its key's later rows), and the next
step's transaction deletes it first (``claim_handoff`` in ``sql/queries.sql``), together
with its inbox record and its work, so

- a hand-off that fails (any error: its transaction rolls back, the row is back), that
  finds an older row of its key still to go, or that the limit of hand-offs in a row
  leaves over, releases the row to the relays at once and wakes them;
- a worker killed after the commit leaves the row to the relays once its lease ends;
- a relay that claimed the row (after the lease) keeps it, and the hand-off does nothing
  (``Outcome.RELAYED``): exactly one of the two sends it, in its key's order.

The step's inbox still absorbs a copy, so nothing here weakens exactly-once effects. What a
hand-off skips is Dramatiq's middleware for that message (retries, time and age limits: a
failure goes back to the relay, whose copy has them) and the queue's broker: the next step
runs in the process that sent its message. Only a step of a queue that process's worker
consumes is handed a message (:class:`WorkerQueues`): a worker started with ``--queues``
leaves every other queue's steps to the workers that consume them.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import attrs
import dramatiq
import psycopg

from estafeta.messaging import outbox as outbox
from estafeta_sql import outbox as store
from estafeta_sql.pool import Database

if TYPE_CHECKING:
    from estafeta.app.runtime import Runtime
    from estafeta.steps.spec import StepSpec


#: How long a handed-off row stays invisible to the relays: longer than a hand-off takes to
#: start (the next step's first round trip), short enough that a killed worker's row is not
#: left waiting long.
LEASE = timedelta(seconds=5)


@attrs.frozen
class Baton:
    """A message handed to the next step: its row waits in ``schema``'s outbox, leased."""

    spec: StepSpec
    message: dramatiq.Message[Any]
    #: The schema of the outbox holding the message's row (the sending service's).
    schema: str
    database: Database
    #: Whether the step wrote outbox rows before this one (a cancel or a statement with an
    #: answer writes the rows sent so far): those are the relays', who must be woken for them.
    wrote_before: bool = False


_thread = threading.local()


def prepare(runtime: Runtime, database: Database, schema: str, conn: psycopg.Connection[Any]) -> Baton | None:
    """Before a step's commit on ``conn``: lease its one outbox row if the message can go straight on.

    Only one message, due now, for a step of :attr:`Runtime.steps_here` on the same
    database, of a queue this process's worker consumes (:attr:`Runtime.queues_here`), goes;
    anything else is left to the relays. Call :func:`offer` once committed.
    """
    if runtime.settings.handoffs == 0:
        return None
    params = outbox.sole_held(conn)
    if params is None or params.get("at") is not None or params.get("delay") != timedelta(0):
        return None
    spec = runtime.steps_here.get(params["actor_name"])
    if spec is None or spec.queue_name != params["queue_name"] or runtime.database(spec.service) is not database:
        return None
    if runtime.queues_here is not None and spec.queue_name not in runtime.queues_here:
        return None  # this worker does not consume the step's queue: its workers do
    wrote_before = outbox.wrote(conn)  # read before the commit writes the held row
    outbox.lease_sole_held(conn, schema, LEASE)
    body = params["message"].obj
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name=spec.queue_name,
        actor_name=spec.actor_name,
        args=tuple(body["args"]),
        kwargs=dict(body["kwargs"]),
        options=dict(body["options"]),
        message_id=str(params["message_id"]),
        message_timestamp=int(time.time() * 1000),
    )
    return Baton(spec=spec, message=message, schema=schema, database=database, wrote_before=wrote_before)


class WorkerQueues(dramatiq.Middleware):
    """Tells ``runtime`` which queues its process's worker consumes, as the worker boots (see :func:`prepare`).

    Dramatiq's worker keeps the queues it was given (``dramatiq estafeta_actors --queues orders``) as
    its ``consumer_whitelist``, empty for every queue.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def before_worker_boot(self, broker: dramatiq.Broker, worker: Any) -> None:
        whitelist = getattr(worker, "consumer_whitelist", None)
        self.runtime.queues_here = frozenset(whitelist) if whitelist else None


def offer(baton: Baton | None) -> None:
    """The step committed: its thread is to run ``baton`` next (:func:`take`)."""
    _thread.baton = baton


def take() -> Baton | None:
    """The hand-off this thread's last step offered (once)."""
    baton: Baton | None = getattr(_thread, "baton", None)
    _thread.baton = None
    return baton


def release(baton: Baton) -> None:
    """Make ``baton``'s leased row due now, for the relays (the caller wakes them)."""
    with baton.database.transaction() as conn:
        store.release_handoff(conn, baton.schema, uuid.UUID(baton.message.message_id))
