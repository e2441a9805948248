"""Network namespaces on a bridge, and the nft rules that cut, half-cut or thin the links between them.

Each component of a test (a server, a worker, the relay, the test's own observer) gets a
network namespace of its own with one address on ``10.77.0.0/24``: a veth pair joins it to
a bridge in the run's *hub* namespace. Every packet between two components crosses that
bridge, so one ``nft`` table there (family ``bridge``, hook ``forward``) decides the fate
of the traffic of every pair: delivered, dropped, or dropped at random. A drop on the
bridge is silent for both ends (no RST, no ICMP, no local ``EPERM``): exactly the failure
that leaves a client waiting for the kernel's TCP timeout.

Nothing here touches the machine's own namespace: the namespaces, the bridge, the veth
pairs and the rules all live in namespaces this module creates, named
``estafeta-fault-<pid>-<n>-<component>``. :meth:`Network.close` kills every process left in
them and deletes them; a run that crashed before it could is cleaned up by the next one
(namespaces whose pid no longer runs).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import attrs

from ..services import require

PREFIX = "estafeta-fault-"
SUBNET = "10.77.0"
NETNS_DIR = Path("/run/netns")
_CLONE_NEWNET = 0x40000000
_counter = itertools.count(1)


@attrs.frozen
class Node:
    """One component's namespace and its address on the bridge."""

    name: str
    netns: str
    address: str

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside this namespace (``ip netns exec``)."""
        return ["ip", "netns", "exec", self.netns, *argv]


@attrs.frozen
class Fault:
    """What happens to packets from ``source`` to ``target``: all dropped, or ``loss`` percent of them."""

    source: Node
    target: Node
    loss: int = 100

    def rule(self) -> str:
        match = f"ip saddr {self.source.address} ip daddr {self.target.address}"
        if self.loss >= 100:
            return f"{match} drop"
        return f"{match} numgen random mod 100 < {self.loss} drop"

    def __str__(self) -> str:
        what = "cut" if self.loss >= 100 else f"{self.loss} % loss"
        return f"{self.source.name} -> {self.target.name}: {what}"


def _run(*argv: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _delete_namespace(netns: str) -> None:
    """Kill every process in ``netns`` (a server's children, Erlang's epmd), then delete it."""
    for _ in range(3):
        pids = _run("ip", "netns", "pids", netns, check=False).stdout.split()
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        # Not reaped here: a process the caller started is the caller's to wait for (a
        # waitpid here took its exit status from its Popen, whose wait() then said 0).
    _run("ip", "netns", "delete", netns, check=False)


def remove_leftovers() -> list[str]:
    """Delete the namespaces of earlier runs whose process is gone (a crash, a SIGKILLed pytest)."""
    removed = []
    for entry in sorted(NETNS_DIR.glob(f"{PREFIX}*")) if NETNS_DIR.exists() else []:
        found = re.match(rf"{re.escape(PREFIX)}(\d+)-", entry.name)
        if found is None:
            continue
        pid = int(found.group(1))
        if pid != os.getpid() and Path(f"/proc/{pid}").exists():
            continue  # a run in progress
        _delete_namespace(entry.name)
        removed.append(entry.name)
    return removed


class Network:
    """The namespaces of one test, on one bridge, and the faults between them.

    ``add`` makes a component's namespace; ``cut``, ``cut_one_way`` and ``lossy`` drop its
    traffic with another one; ``heal`` (one link) and ``heal_all`` deliver it again. The
    whole rule set is replaced atomically on every change (one ``nft -f`` transaction).
    """

    def __init__(self) -> None:
        require("network namespaces", shutil.which("ip") is not None and os.geteuid() == 0, "needs root and iproute2")
        require("nftables", shutil.which("nft") is not None, "no nft: run scripts/system-deps.sh")
        remove_leftovers()
        self.prefix = f"{PREFIX}{os.getpid()}-{next(_counter)}-"
        self.hub = self.prefix + "hub"
        self.nodes: dict[str, Node] = {}
        self.faults: dict[tuple[str, str], Fault] = {}
        self._namespaces: list[str] = []
        self._make_namespace(self.hub)
        _run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.hub, "link", "set", "br0", "up")
        self._apply()

    def _make_namespace(self, netns: str) -> None:
        _run("ip", "netns", "add", netns)
        self._namespaces.append(netns)
        _run("ip", "-n", netns, "link", "set", "lo", "up")

    def add(self, name: str) -> Node:
        """A new namespace for component ``name``, joined to the bridge, with its address."""
        if name in self.nodes:
            raise ValueError(f"component {name!r} is already on this network")
        index = len(self.nodes) + 2
        node = Node(name, self.prefix + name, f"{SUBNET}.{index}")
        self._make_namespace(node.netns)
        port = f"p{index}"  # the hub's end; inside the component's namespace the veth is eth0
        _run("ip", "-n", self.hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
        _run("ip", "-n", self.hub, "link", "set", port, "master", "br0", "up")
        _run("ip", "-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
        _run("ip", "-n", node.netns, "link", "set", "eth0", "up")
        self.nodes[name] = node
        return node

    # -- faults ---------------------------------------------------------------------------

    def cut(self, a: Node, b: Node) -> None:
        """Drop every packet between ``a`` and ``b``, both ways, silently."""
        self._set(Fault(a, b), Fault(b, a))

    def cut_one_way(self, source: Node, target: Node) -> None:
        """Drop every packet from ``source`` to ``target``; the other way still delivers."""
        self._set(Fault(source, target))

    def lossy(self, a: Node, b: Node, percent: int) -> None:
        """Drop ``percent`` % of the packets between ``a`` and ``b`` (each way), at random."""
        if not 0 < percent < 100:
            raise ValueError(f"loss must be between 1 and 99 %, not {percent}")
        self._set(Fault(a, b, percent), Fault(b, a, percent))

    def heal(self, a: Node, b: Node) -> None:
        """Deliver everything between ``a`` and ``b`` again."""
        self.faults.pop((a.name, b.name), None)
        self.faults.pop((b.name, a.name), None)
        self._apply()

    def heal_all(self) -> None:
        """Deliver everything between everyone."""
        self.faults.clear()
        self._apply()

    def _set(self, *faults: Fault) -> None:
        for fault in faults:
            self.faults[(fault.source.name, fault.target.name)] = fault
        self._apply()

    def _apply(self) -> None:
        rules = "".join(f"    {fault.rule()}\n" for fault in self.faults.values())
        # Declaring the table first makes the delete valid on the first call; the three
        # statements are one transaction: no instant without the old or the new rules.
        ruleset = (
            "table bridge estafeta_faults\n"
            "delete table bridge estafeta_faults\n"
            "table bridge estafeta_faults {\n"
            "  chain forward {\n"
            "    type filter hook forward priority 0; policy accept;\n"
            f"{rules}"
            "  }\n"
            "}\n"
        )
        _run("ip", "netns", "exec", self.hub, "nft", "-f", "-", stdin=ruleset)

    def rules(self) -> str:
        """The hub's rule set as ``nft`` lists it."""
        return _run("ip", "netns", "exec", self.hub, "nft", "list", "ruleset").stdout

    # -- the end --------------------------------------------------------------------------

    def close(self) -> None:
        """Kill what still runs in the namespaces and delete them (the veth pairs and the bridge go with them)."""
        for netns in reversed(self._namespaces):
            _delete_namespace(netns)
        self._namespaces.clear()


@contextlib.contextmanager
def network() -> Iterator[Network]:
    """A :class:`Network`, deleted with everything in it when the block ends (also on failure)."""
    net = Network()
    try:
        yield net
    finally:
        net.close()


_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


@contextlib.contextmanager
def inside(node: Node) -> Iterator[None]:
    """Run the block's socket-opening code in ``node``'s namespace (this thread only).

    A socket belongs to the namespace it was created in, for its whole life: a connection
    opened inside the block keeps using ``node``'s address and links after the block ends.
    Only the calling thread moves; a library that connects from a thread of its own (a
    connection pool) does so from the thread's namespace, not this one.
    """
    original = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(NETNS_DIR / node.netns, os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(original)
    finally:
        os.close(target)
        os.close(original)
