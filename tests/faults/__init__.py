"""Network faults between estafeta's components: the harness, and the tests that use it.

Every component of a fault test runs in a network namespace of its own, joined to one
bridge by a veth pair (:mod:`tests.faults.network`); the test cuts, half-cuts, thins and
heals the link between any two components with ``nft`` rules on that bridge, in a
namespace the test created, never in the machine's own. A cut drops packets silently (no
RST): the failure that hangs a client for the kernel's TCP timeout unless it has timeouts
of its own.

- ``network()``: a :class:`~tests.faults.network.Network`; ``add(name)`` gives a
  :class:`~tests.faults.network.Node` (its namespace and address); ``cut``,
  ``cut_one_way``, ``lossy``, ``heal``, ``heal_all``.
- Servers start inside a node's namespace: ``private_postgres(netns=node.netns,
  host=node.address)`` (tests/pg_servers.py), ``redis_servers(1, dir, netns=..., host=...)``
  (tests/redis_servers.py), ``private_rabbitmq(netns=..., host=...)``
  (tests/integration/relay_faults.py).
- Processes start inside one with ``node.command(*argv)`` (``ip netns exec``); the test's own
  connections open inside one with ``inside(node)``.

docs/operations/network-faults.md says how to run them, what they cover and what they found.
"""
