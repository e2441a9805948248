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
    """CPU seconds so far of each group of processes on the machine (/proc/<pid>/stat, user + system)."""
    groups: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        group = group_of(stat[stat.index("(") + 1 : stat.rindex(")")], cmdline)
        groups[group] = groups.get(group, 0.0) + process_cpu(int(entry.name))
    return groups


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
