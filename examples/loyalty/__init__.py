"""A custom service outside the estafeta package, and an idempotent HTTP endpoint in front of it.

Serve it with ``dramatiq examples.loyalty`` (it imports ``actors`` first, so every built-in
service is served too), and manage it with ``estafeta --import examples.loyalty migrate``
and ``estafeta --import examples.loyalty relay``. ``python -m examples.loyalty.http``
starts the HTTP endpoint.
"""

from . import service as service
