"""``bench.before_after``: each side's median and the ratio, from bench.sagas's RabbitMQ row; bad revisions refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.before_after import Refused, figures, summary

ROOT = Path(__file__).resolve().parents[1]


def _found(sagas_per_second: float, cpu_ms: float, workers_ms: float) -> dict[str, Any]:
    """What ``bench.sagas --json`` prints, trimmed to the RabbitMQ row's figures."""
    return {
        "results": {
            "rabbitmq": {
                "baseline": {"step_messages_per_second": 400.0},
                "sagas": {
                    "sagas_per_second": sagas_per_second,
                    "latency_p99": 20.0,
                    "cpu_ms_per_step": cpu_ms,
                    "cpu_ms_per_step_by_process": {"dramatiq worker processes": workers_ms, "PostgreSQL": 3.0},
                },
            }
        }
    }


def test_each_side_is_summed_up_by_its_median_run_and_after_is_divided_by_before() -> None:
    runs = [
        ("before", 0.2, figures(_found(24.0, 10.0, 4.0))),
        ("after", 3.4, figures(_found(28.0, 8.0, 3.5))),
        ("after", 5.7, figures(_found(30.0, 7.5, 3.4))),
        ("before", 8.0, figures(_found(20.0, 11.0, 4.6))),
        ("before", 7.6, figures(_found(26.0, 9.0, 3.8))),
        ("after", 7.7, figures(_found(27.0, 8.2, 3.8))),
    ]
    lines = summary(runs, "6bb1200").splitlines()
    assert "before (load 0.2)" in lines[1] and "after (load 7.7)" in lines[1]
    medians = lines[lines.index(next(line for line in lines if line.startswith("median"))) + 1 :]
    by_name = {line[:30].strip(): line[30:].split() for line in medians}
    assert by_name["sagas/s"] == ["24.00", "28.00", "1.17x"]
    assert by_name["CPU ms per saga step"] == ["10.00", "8.00", "0.80x"]
    assert by_name["dramatiq worker processes"] == ["4.00", "3.50", "0.88x"]
    assert by_name["estafeta relay"] == ["0.00", "0.00", "-"]  # not in either side's figures


def test_a_result_without_a_rabbitmq_row_is_refused_with_what_is_missing() -> None:
    with pytest.raises(Refused, match=r"no RabbitMQ row.*'rabbitmq'"):
        figures({"results": {"stub": {}}})


def test_a_revision_that_is_not_a_commit_exits_2_with_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.before_after", "no-such-revision-here"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"python -m bench.before_after: 'no-such-revision-here' is not a commit of {ROOT}"
    ]
