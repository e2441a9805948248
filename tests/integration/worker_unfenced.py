"""``dramatiq tests.integration.worker_unfenced``: the charge steps with Redis leases but no fencing.

The control of the SIGSTOP test: the same scenario with this worker must double-charge,
which proves that the fencing (not luck or timing) is what prevents it.
"""

from tests import lock_steps
from tests.app import app

binding = app.bind()
binding.runtime._locks = lock_steps.UnfencedRedisLocks.from_settings(binding.settings)
