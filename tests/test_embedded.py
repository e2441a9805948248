"""The embedded PostgreSQL (pgserver) shared by the processes of one working directory."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_START = (
    "import sys; from pathlib import Path; from estafeta_sql import embedded; print(embedded.start(Path(sys.argv[1])))"
)


def _start(data: Path) -> subprocess.CompletedProcess[str]:
    """``embedded.start`` in a process of its own, which stops the server when it exits."""
    return subprocess.run(
        [sys.executable, "-c", _START, str(data)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.heavy
def test_a_process_arriving_while_the_server_is_stopping_waits_and_starts_it(tmp_path: Path) -> None:
    data = tmp_path / "pgdata"
    first = _start(data)  # initdb, start, and stop when it exits
    assert first.returncode == 0, first.stderr
    # The moment another process's exit is stopping the server: postmaster.pid names a live
    # process and says "stopping" (as PostgreSQL writes it during a shutdown), for a second.
    stopping = subprocess.Popen(["sleep", "1.5"])
    threading.Thread(target=stopping.wait, daemon=True).start()  # reaped when it ends, as a server's pid is
    try:
        lines = [str(stopping.pid), str(data), "0", "5432", str(tmp_path), "", "0 0", "stopping"]
        (data / "postmaster.pid").write_text("\n".join(lines) + "\n")
        second = _start(data)
    finally:
        stopping.kill()
        stopping.wait()
    assert second.returncode == 0, second.stderr
    assert second.stdout.startswith("postgresql://")
