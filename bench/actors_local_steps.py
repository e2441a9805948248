"""``dramatiq bench.actors_local_steps``: the order system's workers, the orders service's own saga steps run locally.

The order saga is orchestrated by the orders service, and two of its commands are for that
service's own steps: ``ConfirmOrder`` (the point of no return) and ``CancelOrder`` (the
placing's compensation). With ``Saga(local_steps=True)`` they are not sent: each runs in the
transaction of the reply that moved the saga to it (docs/concepts/sagas.md). ``bench.sagas``'s
``rabbitmq-local`` row runs its workers from this module: six step messages per completed
saga instead of eight. The demo's saga keeps sending them (its tests follow each message).
"""

from __future__ import annotations

import estafeta_actors as actors
from estafeta_actors.order_saga import ORDER_SAGA

ORDER_SAGA.local_steps = True

#: What ``dramatiq`` looks for in the module it imports.
broker = actors.broker
