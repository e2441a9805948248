"""The saga engine's counters: replies, transitions and compensations, by saga.

Apart so that each module that moves a saga (a start, a reply, a deadline, an operator)
counts into the same three, and the watchdog imports them without the engine.
"""

from __future__ import annotations

from prometheus_client import Counter

#: Replies by saga and outcome: ``accepted`` moved a saga, ``stale`` changed nothing.
REPLIES = Counter("estafeta_saga_replies", "Saga replies by outcome", ["saga", "outcome"])
#: Transitions by saga and the status entered.
TRANSITIONS = Counter("estafeta_saga_transitions", "Saga transitions by status entered", ["saga", "status"])
#: Compensations done (the participant answered a compensation command), by saga and step:
#: the seed's ``saga_compensation_total``.
COMPENSATIONS = Counter("estafeta_saga_compensation", "Compensating steps done, by saga and step", ["saga", "step"])
