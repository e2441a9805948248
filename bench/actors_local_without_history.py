"""``dramatiq bench.actors_local_without_history``: DBOS's workload with local steps.

``bench.actors_without_history`` (no order history, no projector: the work DBOS's workflow
does) with the order saga's own steps run locally (``bench.actors_local_steps``): the
``ho-local-nohistory`` row of ``bench.sagas``, with hand-offs, the most an order saga on
estafeta can leave out of DBOS's workload without leaving out a guarantee.
"""

from __future__ import annotations

from bench import actors_without_history
from estafeta_actors.order_saga import ORDER_SAGA

ORDER_SAGA.local_steps = True

#: What ``dramatiq`` looks for in the module it imports.
broker = actors_without_history.broker
