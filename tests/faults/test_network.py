"""The fault harness itself: a cut is silent and total, one way is one way, loss is partial, heal heals.

And nothing is left behind, even by a run that crashed.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from ..helpers import wait_until
from .network import NETNS_DIR, PREFIX, Network, Node, inside, network, remove_leftovers


def _echo_server(node: Node) -> subprocess.Popen[str]:
    """A TCP echo server on ``node``'s address, port 7000, in its namespace."""
    code = (
        "import socket, threading\n"
        f"s = socket.create_server(('{node.address}', 7000))\n"
        "print('up', flush=True)\n"
        "def serve(c):\n"
        "    while (data := c.recv(4096)):\n"
        "        c.sendall(data)\n"
        "while True:\n"
        "    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()\n"
    )
    server = subprocess.Popen(node.command("python3", "-c", code), stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline().strip() == "up"
    return server


def _connect(client: Node, server: Node, timeout: float = 2.0) -> socket.socket:
    with inside(client):
        return socket.create_connection((server.address, 7000), timeout=timeout)


def _round_trip(sock: socket.socket) -> bool:
    try:
        sock.sendall(b"x")
        return sock.recv(1) == b"x"
    except OSError:
        return False


@pytest.mark.heavy
def test_a_cut_drops_everything_silently_and_heal_restores_the_same_connection(net: Network) -> None:
    a, b, c = net.add("a"), net.add("b"), net.add("c")
    server = _echo_server(b)
    try:
        sock = _connect(a, b)
        other = _connect(c, b)
        assert _round_trip(sock)
        net.cut(a, b)
        # Silent: no RST, no error, just nothing (a socket timeout, not a refusal or reset).
        sock.settimeout(1.0)
        with pytest.raises(TimeoutError):
            sock.sendall(b"x")
            sock.recv(1)
        with pytest.raises(TimeoutError):
            _connect(a, b, timeout=1.0)
        assert _round_trip(other), "a cut between a and b must not touch c"
        net.heal(a, b)
        sock.settimeout(10.0)
        assert sock.recv(1) == b"x", "the byte sent during the cut arrives once the link heals (TCP retransmits)"
        assert _round_trip(sock)
    finally:
        server.kill()
        server.wait()


def test_a_one_way_cut_loses_one_direction_only(net: Network) -> None:
    a, b = net.add("a"), net.add("b")
    server = _echo_server(b)
    try:
        sock = _connect(a, b)
        net.cut_one_way(b, a)  # b's answers are lost; a's requests arrive
        assert "ip saddr 10.77.0.3 ip daddr 10.77.0.2 drop" in net.rules()
        assert "ip saddr 10.77.0.2 ip daddr 10.77.0.3" not in net.rules()
        sock.settimeout(1.0)
        with pytest.raises(TimeoutError):
            sock.sendall(b"x")
            sock.recv(1)
        net.heal_all()
        sock.settimeout(10.0)
        assert sock.recv(1) == b"x"
    finally:
        server.kill()
        server.wait()


def test_a_lossy_link_loses_some_packets_and_tcp_still_delivers(net: Network) -> None:
    a, b = net.add("a"), net.add("b")
    net.lossy(a, b, 30)
    assert "numgen random mod 100 < 30 drop" in net.rules()
    with inside(b):
        receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind((b.address, 7001))
    receiver.settimeout(1.0)
    with inside(a):
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for i in range(400):
        sender.sendto(str(i).encode(), (b.address, 7001))
    received = 0
    while True:
        try:
            receiver.recv(64)
            received += 1
        except TimeoutError:
            break
    # 30 % of 400 datagrams dropped at random: far from none and far from all.
    assert 150 < received < 370, received
    net.lossy(a, b, 10)  # fewer retransmissions to wait for (each lost segment costs an RTO)
    server = _echo_server(b)
    try:
        sock = _connect(a, b, timeout=30)
        sock.settimeout(60)
        assert all(_round_trip(sock) for _ in range(10)), "TCP retransmits what the lossy link drops"
    finally:
        server.kill()
        server.wait()


def test_closing_the_network_kills_its_processes_and_removes_every_namespace() -> None:
    with network() as net:
        node = net.add("a")
        sleeper = subprocess.Popen(node.command("sleep", "600"))
        # Until `ip netns exec` has entered the namespace, the process is not in it (a loaded
        # machine shows the gap): close kills what is in its namespaces.
        wait_until(
            lambda: (
                str(sleeper.pid)
                in subprocess.run(["ip", "netns", "pids", node.netns], capture_output=True, text=True).stdout.split()
            ),
            timeout=30,
            what="the sleeper to enter its namespace",
        )
        names = [path.name for path in NETNS_DIR.glob(f"{net.prefix}*")]
        assert sorted(names) == sorted([net.hub, node.netns])
    assert sleeper.wait(10) == -9
    assert not list(NETNS_DIR.glob(f"{net.prefix}*"))


def test_namespaces_of_a_crashed_run_are_removed_by_the_next_one() -> None:
    # A run whose pid no longer exists (pid 2**22 + 1 is above Linux's pid_max ceiling).
    crashed = f"{PREFIX}{2**22 + 1}-1-hub"
    subprocess.run(["ip", "netns", "add", crashed], check=True)
    try:
        assert crashed in remove_leftovers()
        assert not Path(NETNS_DIR / crashed).exists()
    finally:
        subprocess.run(["ip", "netns", "delete", crashed], check=False, capture_output=True)
