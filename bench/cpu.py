"""Where a run's CPU went: the whole machine's busy time, and each group of processes' share (``/proc``)."""

from __future__ import annotations

import os
from pathlib import Path


def process_cpu(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` (all its threads) so far; 0 once it has gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (every process: PostgreSQL, the broker, workers)."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def cpu_by_process_group() -> dict[str, float]:
    """CPU seconds so far of each group of processes on the machine (/proc/<pid>/stat, user + system).

    Workers and relays count only when this process started them (its descendants): on a
    machine shared with other people's test suites, theirs go to "other work on the machine".
    PostgreSQL and the brokers are shared servers, counted whole.
    """
    found: dict[int, tuple[str, str, int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        found[int(entry.name)] = (
            stat[stat.index("(") + 1 : stat.rindex(")")],
            cmdline,
            ppid,
            process_cpu(int(entry.name)),
        )
    ours = {os.getpid()}
    for pid in sorted(found):  # parents usually have lower pids; loop until no change for the rest
        _descend(pid, found, ours)
    groups: dict[str, float] = {}
    for pid, (comm, cmdline, _ppid, seconds) in found.items():
        group = group_of(comm, cmdline)
        if group in _OWN_GROUPS and pid not in ours:
            group = "other work on the machine"
        groups[group] = groups.get(group, 0.0) + seconds
    return groups


#: Groups of processes a benchmark starts itself (the others are shared servers).
_OWN_GROUPS = frozenset({"dramatiq worker processes", "estafeta relay"})


def _descend(pid: int, found: dict[int, tuple[str, str, int, float]], ours: set[int]) -> bool:
    """Whether ``pid`` descends from a process in ``ours`` (added to it if so)."""
    seen = []
    while pid not in ours:
        entry = found.get(pid)
        if entry is None or entry[2] in (0, 1) or pid in seen:
            return False
        seen.append(pid)
        pid = entry[2]
    ours.update(seen)
    return True


def group_of(comm: str, cmdline: str) -> str:
    if "bench.sagas" in cmdline:
        return "this process (placing; the stub's worker and relay)"
    if comm == "postgres":
        return "PostgreSQL"
    if comm.startswith("beam") or "rabbitmq" in cmdline:
        return "RabbitMQ (Erlang)"
    if comm.startswith("redis-server"):
        return "Redis"
    if "bin/dramatiq" in cmdline:
        return "dramatiq worker processes"
    if "bench.dbos_orders" in cmdline:
        return "DBOS executors"
    if "bench.pgqueuer_jobs" in cmdline:
        return "pgqueuer worker"
    if "bin/estafeta relay" in cmdline:
        return "estafeta relay"
    return "everything else"
