"""No run-time import cycle: the project has none, and the check `make lint` runs catches a new one.

A cycle counts when module-level or function-level imports close it (also through a
package's ``__init__``); one closed only by an ``if TYPE_CHECKING:`` import does not.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "scripts" / "check_import_cycles.py"


#: Two modules whose types name each other: ``saga`` imports ``app`` under TYPE_CHECKING only.
TYPE_ONLY_LOOP = {
    "app": "from .saga import Saga\n\nclass App: ...\n",
    "saga": """\
        from __future__ import annotations
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from .app import App

        class Saga:
            def __init__(self, app: App) -> None:
                self.app = app
        """,
}


def check(cwd: Path, *packages: str) -> subprocess.CompletedProcess[str]:
    """Run the check as `make lint` does, from ``cwd``."""
    return subprocess.run(
        [sys.executable, str(CHECK), *packages], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def package(root: Path, name: str, modules: dict[str, str]) -> None:
    """Write package ``name`` under ``root``: ``modules`` maps a module's name to its source."""
    (root / name).mkdir()
    modules = {"__init__": "", **modules}
    for module, source in modules.items():
        (root / name / f"{module}.py").write_text(textwrap.dedent(source))


def test_the_project_has_no_run_time_import_cycle() -> None:
    result = check(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_project_has_no_import_cycle_type_checking_imports_included() -> None:
    result = check(ROOT, "--type-checking")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_cycle_closed_by_a_function_level_import_fails_the_check_with_one_line(tmp_path: Path) -> None:
    package(
        tmp_path,
        "loop",
        {
            "picker": "def pick():\n    from .worker import Worker\n    return Worker\n",
            "worker": "from .picker import pick\n\nclass Worker: ...\n",
            "alone": "import json\n",
        },
    )
    result = check(tmp_path, "loop")
    assert result.returncode == 1, result.stdout + result.stderr
    cycles = [line for line in result.stdout.splitlines() if line.startswith("import cycle:")]
    assert cycles == [
        "import cycle: loop.picker -> loop.worker (loop/picker.py:2), loop.worker -> loop.picker (loop/worker.py:1)"
    ]


def test_a_cycle_through_the_package_init_fails_the_check(tmp_path: Path) -> None:
    package(
        tmp_path,
        "loop",
        {"__init__": "def make():\n    from . import child\n    return child\n", "child": "from loop import make\n"},
    )
    result = check(tmp_path, "loop")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "loop -> loop.child" in result.stdout


def test_a_loop_closed_only_by_a_type_checking_import_passes(tmp_path: Path) -> None:
    package(
        tmp_path,
        "loop",
        TYPE_ONLY_LOOP,
    )
    result = check(tmp_path, "loop")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_loop_closed_only_by_a_type_checking_import_fails_with_type_checking(tmp_path: Path) -> None:
    package(
        tmp_path,
        "loop",
        TYPE_ONLY_LOOP,
    )
    result = check(tmp_path, "--type-checking", "loop")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "loop.saga -> loop.app (loop/saga.py:4)" in result.stdout
    assert "type-checking imports included" in result.stdout
