"""estafeta's pytest plugin as a user gets it: loaded by its entry point, the shipped example test run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from estafeta.testing import AppUnderTest, VirtualClock
from estafeta_actors import pingpong

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "booking" / "test_timeouts.py"


def _install_entry_point(site: Path) -> None:
    """What installing estafeta registers for pytest: its pyproject's pytest11 entry points."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    info = site / "estafeta_plugin_under_test-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: estafeta-plugin-under-test\nVersion: 0\n")
    lines = "".join(f"{name} = {target}\n" for name, target in declared.items())
    (info / "entry_points.txt").write_text(f"[pytest11]\n{lines}")


def _run_pytest(project: Path, site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.fixture
def project(tmp_path: Path, database_url: str) -> Path:
    """A user's project: the example test copied in, the plugin installed through its entry point."""
    (tmp_path / "project").mkdir()
    shutil.copy(EXAMPLE, tmp_path / "project" / "test_timeouts.py")
    _install_entry_point(tmp_path / "site")
    return tmp_path / "project"


@pytest.mark.heavy
def test_the_example_passes_with_the_plugin_from_its_entry_point_even_when_a_conftest_loads_it_too(
    project: Path,
) -> None:
    (project / "pytest.ini").write_text("[pytest]\nestafeta_app = examples.booking:app\n")
    (project / "conftest.py").write_text('pytest_plugins = ["estafeta.testing"]\n')
    ran = _run_pytest(project, project.parent / "site", "-W", "error")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "2 passed" in ran.stdout


@pytest.mark.heavy
def test_without_an_app_under_test_the_plugin_says_how_to_name_one(project: Path) -> None:
    (project / "pytest.ini").write_text("[pytest]\n")
    ran = _run_pytest(project, project.parent / "site")
    assert ran.returncode != 0
    assert "set estafeta_app = package.module:app in the pytest configuration" in ran.stdout + ran.stderr
    (project / "pytest.ini").write_text("[pytest]\nestafeta_app = examples.nowhere:app\n")
    ran = _run_pytest(project, project.parent / "site")
    assert "estafeta_app = 'examples.nowhere:app': cannot import 'examples.nowhere'" in ran.stdout + ran.stderr


def test_a_delayed_send_is_published_by_the_clock_move_that_makes_it_due(
    estafeta_app: AppUnderTest, clock: VirtualClock
) -> None:
    with estafeta_app.runtime.database("pingpong").transaction() as tx:
        pingpong.SERVICE.send(tx, pingpong.Ping(uuid.uuid4(), datetime.now(UTC)), delay=timedelta(hours=1))
    assert estafeta_app.sent_to("pingpong") == []
    assert clock.advance(timedelta(minutes=59)).published == 0
    assert clock.advance(timedelta(minutes=2)).published == 1
    assert [m.actor_name for m in estafeta_app.sent_to("pingpong")] == ["pingpong.ping"]
    # The ping's step runs and sends its pong, which is held back on its queue.
    assert estafeta_app.run_until_idle(hold={"pingpong.pong"}) == [("pingpong.ping", "ok")]
    assert [m.actor_name for m in estafeta_app.sent_to("pingpong")] == ["pingpong.pong"]
    assert estafeta_app.run_until_idle() == [("pingpong.pong", "ok")]
    assert estafeta_app.sent_to("pingpong") == []
