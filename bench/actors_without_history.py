"""``dramatiq bench.actors_without_history``: the order system's workers without the order's history.

The order saga's ``on_transition`` hook (each transition appended to the order's event
stream) and the ``OrderSummary`` projector that reads that stream are the demo's, not the
saga's: DBOS's workflow, which ``bench.sagas`` runs beside estafeta's saga, keeps no such
history. ``bench.sagas``'s ``ho-nohistory`` row runs its workers from this module to
measure the same work as DBOS's: the four local steps, their refusals and compensations,
and the saga's own row and transition log.
"""

from __future__ import annotations

import estafeta_actors as actors
from estafeta.events.projector_run import ProjectorsMiddleware
from estafeta_actors.order_saga import ORDER_SAGA

ORDER_SAGA.on_transition = None
for middleware in actors.broker.middleware:
    if isinstance(middleware, ProjectorsMiddleware):
        middleware.projectors.clear()  # booted with nothing to run

#: What ``dramatiq`` looks for in the module it imports.
broker = actors.broker
