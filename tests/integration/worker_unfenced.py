"""``dramatiq tests.integration.worker_unfenced``: the charge steps with Redis leases but no fencing.

The control of the SIGSTOP test: the same scenario with this worker must double-charge,
which proves that the fencing (not luck or timing) is what prevents it.
"""

import actors
from actors.step import bind
from tests import lock_steps

actors.runtime._locks = lock_steps.UnfencedRedisLocks.from_settings(actors.settings)
bind(actors.broker, actors.runtime)
