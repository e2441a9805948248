"""estafeta as a user gets it: a wheel and an sdist built from the repository, installed outside it.

The wheel is built with ``python -m build`` (the sdist first, then the wheel from the
sdist, so the sdist is proved complete too), installed into a fresh virtual environment in
a temporary directory, with the extras and packages the tutorial's install line names.
From there run what a user runs: ``estafeta --help``, ``estafeta demo`` on the embedded
default, and the tutorial (docs/tutorial.md) as written: its files written from the page's
blocks (``title="..."``), its shell commands run in order against the test's own PostgreSQL
database and RabbitMQ vhost, so the test fails when the page and reality part.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ..helpers import wait_until
from ..services import RUN_ID, admin_dsn, rabbitmq_vhost
from . import processes
from .tutorial import Tutorial, expand

pytestmark = [pytest.mark.integration, pytest.mark.heavy]

ROOT = processes.ROOT
#: The repository's folders the distribution installs, and the names it installs them under.
INSTALLED = {"estafeta": "estafeta", **{f: f"estafeta_{f}" for f in ("actors", "brokers", "sql", "cli", "console")}}
PACKAGES = tuple(INSTALLED)


def _run(argv: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, **options)


def clean_copy(to: Path) -> Path:
    """The working tree's files as a fresh clone has them (no egg-info, no build/ a build would reuse)."""
    listed = _run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"], timeout=60)
    assert listed.returncode == 0, listed.stderr
    for name in listed.stdout.splitlines():
        if (ROOT / name).is_file():  # not one deleted in the working tree
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, to / name)
    return to


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build``'s wheel and sdist of a clean copy of the working tree."""
    out, source = tmp_path_factory.mktemp("dist"), clean_copy(tmp_path_factory.mktemp("clone"))
    built = _run([sys.executable, "-m", "build", "--outdir", str(out), str(source)], timeout=900)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment outside the repository, the wheel installed as the tutorial says."""
    wheel_name, extras, others = Tutorial.load().wheel_install()
    assert (dist / wheel_name).is_file(), f"the tutorial installs {wheel_name}; the build made {os.listdir(dist)}"
    venv = tmp_path_factory.mktemp("user") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = _run(
        [str(venv / "bin" / "pip"), "install", "--quiet", f"{dist / wheel_name}{extras}", *others],
        env=user_env(venv),
        timeout=900,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    return venv


def user_env(venv: Path, **extra: str) -> dict[str, str]:
    """A user's shell with ``venv`` activated: no estafeta setting, nothing of the repository on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESTAFETA_") and k != "PYTHONPATH"}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), **extra)
    return env


def _tracked(*paths: str) -> set[str]:
    listed = _run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard", "--", *paths],
                  timeout=60)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    return {name for name in listed.stdout.splitlines() if "/tests/" not in f"/{name}"}


def test_the_wheel_and_the_sdist_hold_every_file_of_the_packages(dist: Path) -> None:
    files = _tracked(*PACKAGES)
    assert {
        "estafeta/py.typed",
        "sql/migrations/_saga/0001_tables.sql",
        "console/pages/templates/console.html",
    } <= files
    (wheel,) = dist.glob("estafeta-*-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as whl:
        installed = {INSTALLED[name.split("/")[0]] + name[len(name.split("/")[0]) :] for name in files}
        assert installed - set(whl.namelist()) == set()
        assert not {name.split("/")[0] for name in whl.namelist()} & {"actors", "brokers", "sql", "cli", "console"}
    (sdist,) = dist.glob("estafeta-*.tar.gz")
    with tarfile.open(sdist) as tar:
        top = sdist.name.removesuffix(".tar.gz")
        inside = {name.removeprefix(f"{top}/") for name in tar.getnames()}
    assert (files | {"pyproject.toml", "README.md"}) - inside == set()


def test_the_installed_wheel_runs_estafeta_help_and_the_embedded_demo(venv: Path, tmp_path: Path) -> None:
    env, bin_ = user_env(venv), venv / "bin"
    where = _run([str(bin_ / "python"), "-c", "import estafeta as e, estafeta_sql as s; print(e.__file__, s.__file__)"],
                 cwd=tmp_path, env=env, timeout=60)  # fmt: skip
    assert where.returncode == 0, where.stderr
    assert all(path.startswith(str(venv)) for path in where.stdout.split()), where.stdout
    helped = _run([str(bin_ / "estafeta"), "--help"], cwd=tmp_path, env=env, timeout=60)
    assert helped.returncode == 0, helped.stderr
    assert "Usage: estafeta" in helped.stdout
    # No ESTAFETA_DATABASE_URL: the embedded PostgreSQL (the embedded extra), in ./.estafeta.
    demo = _run([str(bin_ / "estafeta"), "demo", "--orders", "20"], cwd=tmp_path, env=env, timeout=900)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert (tmp_path / ".estafeta").is_dir()


#: A project's own modules under the names the repository's folders have, beside its app.
OWN_MODULES = {
    "sql.py": "MINE = 'sql'\n",
    "brokers.py": "MINE = 'brokers'\n",
    "cli.py": "MINE = 'cli'\n",
    "actors/__init__.py": "MINE = 'actors'\n",
    "console.py": "MINE = 'console'\n",
    "shop.py": (
        "import estafeta\n"
        "import actors, brokers, cli, console, sql\n"
        "mine = {m.MINE for m in (actors, brokers, cli, console, sql)}\n"
        "assert mine == {'actors', 'brokers', 'cli', 'console', 'sql'}, mine\n"
        "desk = estafeta.Service('desk')\n"
        "app = estafeta.App('shop', services=[desk])\n"
        "broker = app.bind().broker\n"
    ),
}


def test_a_project_with_its_own_sql_brokers_cli_actors_and_console_modules_runs_estafeta(
    venv: Path, tmp_path: Path, database_url: str, amqp_url: str
) -> None:
    for name, text in OWN_MODULES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    env = user_env(venv, ESTAFETA_DATABASE_URL=database_url, ESTAFETA_BROKER_URL=amqp_url, PYTHONPATH=str(tmp_path))
    bin_ = venv / "bin"
    for command in (["--app", "shop:app", "migrate"], ["--app", "shop:app", "outbox", "stats"]):
        done = _run([str(bin_ / "estafeta"), *command], cwd=tmp_path, env=env, timeout=120)
        assert done.returncode == 0, f"estafeta {' '.join(command)}: {done.stdout}{done.stderr}"
    argv = [str(bin_ / "dramatiq"), "shop", "--processes", "1"]
    worker = processes.Process("shop-workers", argv, env, tmp_path, cwd=tmp_path)
    try:
        wait_until(lambda: "ready for action" in worker.output(), timeout=120, what="the project's worker ready")
        assert worker.popen.poll() is None, worker.output()
    finally:
        worker.stop()
    printed = worker.log.read_text(errors="replace")
    assert "Error" not in printed, printed


@pytest.fixture
def tutorial_services() -> Iterator[dict[str, str]]:
    """The values the test gives the tutorial's variables: its own database, vhost and test server."""
    database = f"estafeta_tutorial_{uuid.uuid4().hex[:10]}"
    server = f"postgresql://{os.environ['PGUSER']}@{os.environ['PGHOST']}:{os.environ['PGPORT']}"
    with rabbitmq_vhost(f"{RUN_ID}-tutorial") as amqp_url:
        try:
            yield {
                "database": database,
                "ESTAFETA_DATABASE_URL": f"{server}/{database}",
                "ESTAFETA_BROKER_URL": amqp_url,
                "ESTAFETA_TEST_DATABASE_URL": f"{server}/{os.environ['PGDATABASE']}",
            }
        finally:
            with psycopg.connect(admin_dsn(), autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


@pytest.mark.timeout(900)
def test_the_tutorial_runs_as_written_outside_the_repository(
    venv: Path, tmp_path: Path, tutorial_services: dict[str, str]
) -> None:
    tutorial = Tutorial.load()
    project = tmp_path / "project"
    tutorial.write_files(project)
    session = Session(venv, project, tmp_path, tutorial_services)
    with session:
        for words in tutorial.shell_commands():
            session.run(words)
    assert session.overridden == set(tutorial_services) - {"database"}, "the tutorial no longer sets them"
    assert session.booked and session.listed, "the tutorial no longer books, or no longer lists the sagas"


class Session:
    """A user's shell in the project's directory: exports kept, long-running commands in the background."""

    def __init__(self, venv: Path, project: Path, logs: Path, services: dict[str, str]) -> None:
        self.env, self.project, self.logs, self.services = user_env(venv), project, logs, services
        self.overridden: set[str] = set()
        self.background: list[processes.Process] = []
        self.booked: list[str] = []
        self.listed = False

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.background:
            if exc[0] is not None:
                print(f"--- {proc.name} output ---\n{proc.output()[-4000:]}")
            proc.stop()

    def run(self, words: list[str]) -> None:
        """Run one command of the page as the reader would."""
        tool, args = words[0], [expand(word, self.env) for word in words[1:]]
        if tool in ("pip", "git") or (tool == "python" and args[:2] == ["-m", "build"]):
            return  # the install: the venv fixture installed the wheel as the page says
        if tool == "export":
            for assignment in args:
                self._export(*assignment.split("=", 1))
        elif tool == "createdb":
            assert args == [self._tutorial_database()], f"createdb {args}: not the database the page configures"
            self._complete(["createdb", self.services["database"]])
        elif tool == "dramatiq" or args[:1] == ["relay"]:
            self._start(tool, args)
        elif args[:2] == ["sagas", "list"]:
            self._wait_for_sagas([tool, *args])
        else:
            done = self._complete([tool, *args])
            if tool == "python" and args[:1] == ["book.py"]:
                self.booked.append(done.stdout.strip())

    def _export(self, name: str, value: str) -> None:
        if name in self.services:
            self.overridden.add(name)
            value = self.services[name]
        self.env[name] = value

    def _tutorial_database(self) -> str:
        """The database of the page's ESTAFETA_DATABASE_URL (exported after createdb: read ahead)."""
        found = re.search(r"ESTAFETA_DATABASE_URL=postgresql://[^/\s]+/(\w+)", Tutorial.load().text)
        assert found, "the tutorial exports no ESTAFETA_DATABASE_URL=postgresql://HOST/DATABASE"
        return found.group(1)

    def _complete(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        argv = [shutil.which(argv[0], path=self.env["PATH"]) or argv[0], *argv[1:]]
        done = _run(argv, cwd=self.project, env=self.env, timeout=300)
        output = done.stdout[-3000:] + done.stderr[-3000:]
        assert done.returncode == 0, f"{shlex.join(argv)}: exit {done.returncode}\n{output}"
        return done

    def _start(self, tool: str, args: list[str]) -> None:
        argv = [shutil.which(tool, path=self.env["PATH"]) or tool, *args]
        self.background.append(processes.Process(tool, argv, self.env, self.logs, cwd=self.project))

    def _wait_for_sagas(self, argv: list[str]) -> None:
        """The booked sagas listed with the statuses the page shows (the workers take a moment)."""
        expected = Tutorial.load().statuses_after(argv)
        assert len(expected) == len(self.booked), f"the page shows {expected} for {len(self.booked)} bookings"

        listing = [""]

        def listed() -> bool:
            listing[0] = self._complete(argv).stdout
            # STARTED (date, time, UTC), SAGA, STATUS, ...
            found = {line.split()[3]: line.split()[4] for line in listing[0].splitlines() if len(line.split()) > 4}
            return sorted(found.get(saga_id, "") for saga_id in self.booked) == sorted(expected)

        try:
            wait_until(listed, timeout=120, interval=0.5, what=f"the bookings listed {expected}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {shlex.join(argv)} printed:\n{listing[0]}") from None
        self.listed = True
