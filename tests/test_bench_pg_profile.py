"""``bench.pg_profile``: PostgreSQL's samples read from ``perf script``, and a real run under ``perf``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.pg_profile import phase_shares, stacks, top_functions

ROOT = Path(__file__).resolve().parents[1]

# perf script -F comm,ip,sym: a header per sample (its command), then its stack, innermost first.
SCRIPT = """\
postgres
\t    55d4262e8ed9 hash_search_with_hash_value
\t    55d4262e8319 pg_plan_query
\t    55d4262e9059 fmgr_sql
\t    55d4262e9000 PortalRun
\t    55d4262e9001 PostgresMain

dramatiq
\t    7fadcf3ebc6c _PyEval_EvalFrameDefault
\t    7fadcf3ebc00 pg_plan_query

postgres
\t    ffffffff81000000 tcp_sendmsg
\t    ffffffff81000001 __sys_sendto
\t    ffffffff81000002 do_syscall_64
\t    55d4262e9002 0x00005568d42e8ed9
\t    55d4262e9000 PortalRun

postgres
\t    55d4262e8ed0 [unknown]
\t    55d4262e8ed1 XLogFlush
\t    55d4262e8ed2 CommitTransactionCommand
"""


def test_only_postgres_s_stacks_are_read_innermost_first() -> None:
    found = stacks(SCRIPT.splitlines())
    assert len(found) == 3  # the dramatiq sample is left out
    assert found[0][:2] == ["hash_search_with_hash_value", "pg_plan_query"]


def test_a_phase_counts_every_sample_with_one_of_its_functions_on_the_stack() -> None:
    shares = dict(phase_shares(stacks(SCRIPT.splitlines())))
    assert shares["statements run (PortalRun)"] == pytest.approx(200 / 3)
    assert shares["planning"] == pytest.approx(100 / 3)
    assert shares["SQL function calls (not inlined)"] == pytest.approx(100 / 3)
    assert shares["socket sends"] == pytest.approx(100 / 3)
    assert shares["commit"] == shares["WAL flush (XLogFlush)"] == pytest.approx(100 / 3)
    assert shares["PL/pgSQL function calls"] == 0


def test_the_innermost_named_function_is_the_one_listed() -> None:
    assert dict(top_functions(stacks(SCRIPT.splitlines()), 5)) == pytest.approx(
        {"hash_search_with_hash_value": 100 / 3, "tcp_sendmsg": 100 / 3, "XLogFlush": 100 / 3}
    )


@pytest.mark.heavy
def test_a_real_run_finds_postgresql_s_samples_and_the_saga_benchmark_s_summary() -> None:
    if shutil.which("perf") is None:
        if os.environ.get("CI"):
            pytest.fail("perf is not installed (Debian's linux-perf)")
        pytest.skip("perf is not installed (Debian's linux-perf)")
    run = subprocess.run(
        [sys.executable, "-m", "bench.pg_profile", "--orders", "200", "--settle", "4", "--seconds", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    samples = re.search(r"PostgreSQL's samples: ([\d,]+)", run.stdout)
    assert samples and int(samples.group(1).replace(",", "")) > 0, run.stdout
    running = re.search(r"([\d.]+)%  statements run", run.stdout)
    assert running and float(running.group(1)) > 0, run.stdout
    assert "sagas/s" in run.stdout  # bench.sagas's own table follows
