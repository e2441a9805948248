"""What became of one delivery of a message to a step: :class:`Outcome`.

Apart from the delivery so that parking, which also ends a delivery, and the callers
that count or assert outcomes name it without importing the delivery's transaction.
"""

from __future__ import annotations

import enum


class Outcome(enum.StrEnum):
    """What became of one delivery of a message to a step."""

    #: The step's work committed (with its outbox rows and its answer).
    OK = "ok"
    #: The step refused for a business reason: its work rolled back, the refusal was answered.
    FAILED = "failed"
    #: The inbox already had the message: nothing happened.
    DUPLICATE = "duplicate"
    #: Parked in the service's dead letters with the reason; never retried.
    DEAD_LETTERED = "dead_lettered"
    #: A hand-off whose outbox row a relay had first (``estafeta.messaging.handoff``): nothing happened here.
    RELAYED = "relayed"
