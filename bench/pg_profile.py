"""``python -m bench.pg_profile``: where PostgreSQL's CPU goes while the order saga runs, by function.

    python -m bench.pg_profile [--broker ho-nohistory] [--orders 2000] [--settle 14] [--seconds 15]

Runs ``python -m bench.sagas --broker B --no-peers --steady-rate 0 --orders N`` and, once its
sagas are under way (``--settle`` seconds after the start), samples the whole machine with
``perf record -a -g`` for ``--seconds``. Debian's PostgreSQL exports its function names, so
the backends' stacks can be read: the report gives, for each phase of a statement's life,
the share of PostgreSQL's samples with that phase on the stack (a sample counts under every
function on its stack, so the shares overlap), then the functions PostgreSQL spent the most
samples in, and the saga benchmark's own summary.

It showed ``clock_now()`` planned again at every call and psycopg's prepared statements
dropped at every refusal, both since fixed (docs/performance.md). Needs ``perf`` (Debian's
``linux-perf``) and the right to sample every process (root, or ``perf_event_paranoid`` -1).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The phases reported: a name, and the PostgreSQL (or kernel) functions that mark it.
PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("statements run (PortalRun)", ("PortalRun",)),
    ("planning", ("pg_plan_query",)),
    ("parsing", ("raw_parser",)),
    ("parse analysis", ("pg_analyze_and_rewrite_varparams", "pg_analyze_and_rewrite_fixedparams")),
    ("SQL function calls (not inlined)", ("fmgr_sql",)),
    ("PL/pgSQL function calls", ("plpgsql_call_handler",)),
    ("executor start", ("standard_ExecutorStart",)),
    ("index inserts", ("ExecInsertIndexTuples",)),
    ("commit", ("CommitTransactionCommand",)),
    ("WAL flush (XLogFlush)", ("XLogFlush",)),
    ("system calls", ("do_syscall_64",)),
    ("socket sends", ("__sys_sendto",)),
    ("socket receives", ("__sys_recvfrom",)),
    ("fdatasync", ("__x64_sys_fdatasync",)),
)


def stacks(perf_script: Iterable[str], comm: str = "postgres") -> list[list[str]]:
    """The call stacks (innermost first) of ``comm``'s samples in ``perf script -F comm,ip,sym``'s output."""
    found: list[list[str]] = []
    current: list[str] | None = None
    for line in perf_script:
        if not line.strip():
            continue
        if not line[0].isspace():  # a sample's header: its command
            if current is not None:
                found.append(current)
            current = [] if line.split()[0] == comm else None
        elif current is not None:
            parts = line.split()
            if len(parts) >= 2:
                current.append(parts[1])
    if current is not None:
        found.append(current)
    return found


def phase_shares(samples: Sequence[list[str]]) -> list[tuple[str, float]]:
    """Each phase's share of ``samples`` (percent): those with one of its functions on the stack."""
    total = len(samples) or 1
    return [
        (name, 100 * sum(1 for stack in samples if any(f in stack for f in functions)) / total)
        for name, functions in PHASES
    ]


def top_functions(samples: Sequence[list[str]], count: int) -> list[tuple[str, float]]:
    """The innermost named functions with the most samples (percent of ``samples``)."""
    total = len(samples) or 1
    leaves = Counter(next((f for f in stack if not f.startswith("0x") and f != "[unknown]"), "?") for stack in samples)
    return [(name, 100 * n / total) for name, n in leaves.most_common(count)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_profile", description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="ho-nohistory", help="bench.sagas's broker row (default ho-nohistory)")
    parser.add_argument("--orders", type=int, default=2000, help="sagas placed at once (default 2000)")
    parser.add_argument("--settle", type=float, default=14.0, help="seconds before sampling starts (default 14)")
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds sampled (default 15)")
    parser.add_argument("--top", type=int, default=15, help="functions listed (default 15)")
    args = parser.parse_args(argv)
    perf = shutil.which("perf")
    if perf is None:
        print("bench.pg_profile: perf not found (Debian's linux-perf)", file=sys.stderr)
        return 2
    sagas = subprocess.Popen(
        [sys.executable, "-m", "bench.sagas", "--broker", args.broker, "--no-peers", "--steady-rate", "0",
         "--orders", str(args.orders)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        data = Path(scratch) / "perf.data"
        time.sleep(args.settle)
        recorded = subprocess.run(
            [perf, "record", "-a", "-g", "-F", "499", "-o", str(data), "--", "sleep", str(args.seconds)],
            capture_output=True, text=True,
        )  # fmt: skip
        summary, _ = sagas.communicate()
        if recorded.returncode != 0:
            print(f"bench.pg_profile: perf record failed: {recorded.stderr.strip()}", file=sys.stderr)
            return 1
        script = subprocess.run(
            [perf, "script", "-i", str(data), "-F", "comm,ip,sym"], capture_output=True, text=True, check=True
        )
    samples = stacks(script.stdout.splitlines())
    print(f"PostgreSQL's samples: {len(samples):,} in {args.seconds:g} s ({args.broker}, {args.orders} orders)")
    print("share of them with, on the stack:")
    for name, share in phase_shares(samples):
        print(f"  {share:5.1f}%  {name}")
    print("innermost functions:")
    for name, share in top_functions(samples, args.top):
        print(f"  {share:5.1f}%  {name}")
    print(summary.rstrip())
    return 0 if sagas.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
