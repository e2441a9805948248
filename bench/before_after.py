"""``python -m bench.before_after REV``: the order saga on RabbitMQ from an older commit and from this one, alternated.

    python -m bench.before_after 6bb1200 [--rounds 3] [--orders 500] [--keep]

A before-and-after is only worth something from one machine in one sitting: the same code
ran at twice the rate on one two-core machine as on another (docs/performance.md). This
checks ``REV`` out into a git worktree beside this checkout, gives it a virtual environment
of its own (``make .venv/.installed`` and the ``bench`` extra, from the package registries
this machine reaches), then runs each checkout's own ``python -m bench.sagas --broker
rabbitmq --no-peers --steady-rate 0 --json`` in turn, ``--rounds`` times each (every other
round the other one first, so a machine that drifts favours neither). It prints every run
with the load average before it (the last minute's: the previous run's processes count),
then the median of each side and the ratio of the medians: ping/pong step messages/s,
sagas/s, CPU ms per saga step message for the whole machine and by process group.

Each side runs its own benchmark, so ``REV`` must have ``bench.sagas`` with ``--json`` (any
commit since the order saga's benchmark has). The worktree is removed at the end unless
``--keep``; it stays, with its virtual environment, to be reused by the next run when kept.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .common import describe, machine
from .sagas import round_order

ROOT = Path(__file__).resolve().parents[1]
#: The process groups shown, in this order (``bench.cpu``'s names); the rest go unshown.
GROUPS = ("dramatiq worker processes", "PostgreSQL", "estafeta relay", "RabbitMQ (Erlang)")


class Refused(Exception):
    """A revision, checkout or run this benchmark cannot use: one line, exit code 2."""


def figures(found: dict[str, Any]) -> dict[str, float]:
    """The figures compared, from one ``bench.sagas --json`` object (its RabbitMQ row)."""
    try:
        row = found["results"]["rabbitmq"]
        sagas = row["sagas"]
        by_process = sagas["cpu_ms_per_step_by_process"]
        return {
            "ping/pong step messages/s": float(row["baseline"]["step_messages_per_second"]),
            "sagas/s": float(sagas["sagas_per_second"]),
            "p99 s": float(sagas["latency_p99"]),
            "CPU ms per saga step": float(sagas["cpu_ms_per_step"]),
            **{f"  {group}": float(by_process.get(group, 0.0)) for group in GROUPS},
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise Refused(f"bench.sagas --json gave no RabbitMQ row with its figures (missing {exc})") from exc


def summary(runs: Sequence[tuple[str, float, dict[str, float]]], rev: str) -> str:
    """Every run, then each side's median and after / before, as a table.

    ``runs`` is ``(side, load average before the run, figures)`` in the order run; side is
    ``"before"`` or ``"after"``.
    """
    names = list(runs[0][2])
    width = max(len(name) for name in names) + 2
    lines = [f"order saga on RabbitMQ, {rev} (before) against this checkout (after): {describe(machine())}"]
    lines.append(f"{'':<{width}}" + "".join(f"{f'{side} (load {load:.1f})':>20}" for side, load, _ in runs))
    for name in names:
        lines.append(f"{name:<{width}}" + "".join(f"{found[name]:>20.2f}" for _, _, found in runs))
    medians = {
        side: {name: statistics.median(found[name] for s, _, found in runs if s == side) for name in names}
        for side in ("before", "after")
    }
    lines.append(f"{'median':<{width}}{'before':>20}{'after':>20}{'after / before':>20}")
    for name in names:
        before, after = medians["before"][name], medians["after"][name]
        ratio = f"{after / before:.2f}x" if before else "-"
        lines.append(f"{name:<{width}}{before:>20.2f}{after:>20.2f}{ratio:>20}")
    return "\n".join(lines)


def checkout(rev: str) -> Path:
    """A worktree of ``rev`` with its virtual environment and the ``bench`` extra installed."""
    resolved = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if resolved.returncode != 0:
        raise Refused(f"{rev!r} is not a commit of {ROOT}")
    commit = resolved.stdout.strip()
    place = Path(tempfile.gettempdir()) / f"estafeta-before-{commit[:12]}"
    if not (place / ".git").exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=False)
        _run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(place), commit], "check out")
    _run(["make", "-C", str(place), "--quiet", ".venv/.installed"], "make .venv/.installed in the old checkout")
    _run([str(place / ".venv/bin/pip"), "install", "--quiet", "-e", f"{place}[bench]"], "install its bench extra")
    return place


def remove(place: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(place)], check=False)


def _run(command: list[str], what: str, **options: Any) -> str:
    """``command``'s output; :class:`Refused` with its last line of output if it fails."""
    done = subprocess.run(command, capture_output=True, text=True, **options)
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise Refused(f"could not {what}: {last[0]}")
    return done.stdout


def measure(place: Path, orders: int) -> dict[str, float]:
    """One ``bench.sagas`` RabbitMQ run of the checkout at ``place`` (its own interpreter and code)."""
    command = [str(place / ".venv/bin/python"), "-m", "bench.sagas", "--broker", "rabbitmq", "--no-peers"]
    command += ["--steady-rate", "0", "--orders", str(orders), "--json"]
    out = _run(command, f"run bench.sagas in {place}", cwd=place, env={**os.environ, "PYTHONPATH": ""})
    return figures(json.loads(out))


def parser() -> argparse.ArgumentParser:
    found = argparse.ArgumentParser(prog="python -m bench.before_after", description=__doc__.split("\n")[0])
    found.add_argument("rev", help="the older commit (a hash, tag or branch of this repository)")
    found.add_argument("--rounds", type=int, default=3, help="runs of each side, alternated (default 3)")
    found.add_argument("--orders", type=int, default=500, help="sagas placed at once per run (default 500)")
    found.add_argument("--keep", action="store_true", help="keep the old checkout and its virtual environment")
    return found


def main(argv: list[str] | None = None) -> None:
    options = parser()
    args = options.parse_args(argv)
    if args.rounds < 1:
        options.error(f"--rounds must be at least 1, not {args.rounds}")
    try:
        place = checkout(args.rev)
        print(f"{args.rev} checked out at {place}", file=sys.stderr)
        try:
            runs = []
            for round_ in range(args.rounds):
                for side, where in round_order([("before", place), ("after", ROOT)], round_):
                    load = os.getloadavg()[0]
                    print(f"round {round_ + 1}: {side}, load {load:.1f}", file=sys.stderr)
                    runs.append((side, load, measure(where, args.orders)))
        finally:
            if not args.keep:
                remove(place)
    except Refused as exc:
        print(f"python -m bench.before_after: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(summary(runs, args.rev))


if __name__ == "__main__":
    main()
