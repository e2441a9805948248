"""The documentation's references match the code, and nothing in the code goes undocumented.

The settings, CLI and metrics tables of ``docs/reference/`` are generated at build time by
``docs/_hooks/reference.py``; these tests fail when a setting has no ``#:`` comment, a
command or an option has no help, a metric has no help text, an alert has no runbook
entry, or a page stops asking for its generated table.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from types import ModuleType

import attrs
import pytest

from estafeta import Settings, SettingsError, __version__

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


@cache
def reference() -> ModuleType:
    """The generator of the reference pages (loaded by path, as MkDocs loads its hooks)."""
    spec = importlib.util.spec_from_file_location("docs_reference", DOCS / "_hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_setting_has_a_meaning() -> None:
    undocumented = [s.variable for s in reference().settings() if not s.meaning.strip()]
    assert not undocumented, f"settings without a #: comment in estafeta/app/settings.py: {undocumented}"


def test_the_settings_table_lists_every_field_under_the_variable_that_sets_it() -> None:
    rows = {s.name: s.variable for s in reference().settings()}
    assert {f.name for f in attrs.fields(Settings)} <= set(rows)
    for name, variable in rows.items():
        if name in ("app", "config", "service_database_urls"):
            continue
        default = getattr(Settings(), name)
        try:
            Settings.from_env({variable: "7d" if hasattr(default, "total_seconds") else str(default or 1)})
        except SettingsError as exc:
            assert "unknown setting" not in str(exc), f"{variable} is not the variable of Settings.{name}"


def test_every_command_option_and_argument_has_help() -> None:
    missing = [c.path for c in reference().commands() if not c.help.strip()]
    missing += [f"{c.path} {o.names}" for c in reference().commands() for o in c.options if not o.help.strip()]
    assert not missing, f"commands or options without help: {missing}"


def test_the_cli_reference_has_every_command() -> None:
    text = reference().cli_markdown()
    group = reference().cli_group()
    for name in group.list_commands(None):  # type: ignore[arg-type]
        assert f"`estafeta {name}`" in text


def test_every_metric_has_help_text() -> None:
    metrics = reference().metrics()
    assert len(metrics) >= 20
    assert not [m.name for m in metrics if not m.meaning.strip()]


def test_every_collector_class_can_be_described() -> None:
    """A new collector class needs a module-level instance or a factory in the generator."""
    assert reference().unknown_collectors() == []


def test_every_alert_has_a_runbook_entry() -> None:
    alerts = set(re.findall(r"- alert: (\w+)", (ROOT / "ops" / "prometheus" / "alerts.yml").read_text()))
    runbook = (DOCS / "operations" / "runbook.md").read_text()
    entries = set(re.findall(r"^## (\w+)$", runbook, re.MULTILINE))
    assert alerts == entries
    for section in runbook.split("\n## ")[1:]:
        assert "**Means**" in section and "**Check**" in section and "**Fix**" in section, section[:40]


@pytest.mark.parametrize(("page", "table"), [("settings", "settings"), ("cli", "cli"), ("metrics", "metrics")])
def test_the_reference_pages_ask_for_their_generated_tables(page: str, table: str) -> None:
    text = (DOCS / "reference" / f"{page}.md").read_text()
    assert f"<!-- generated: {table} -->" in text
    rendered = reference().on_page_markdown(text)
    assert "<!-- generated" not in rendered and rendered.count("\n|") > 5


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "_hooks" not in p.parts}
    assert {p for p in pages if p not in nav} == set()


def test_the_version_has_one_source() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "estafeta.__version__"}
    assert f"## [{__version__}]" in (ROOT / "CHANGELOG.md").read_text()
    done = subprocess.run(
        [sys.executable, "-m", "estafeta_cli", "--version"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"estafeta {__version__}"


def test_the_wheel_the_install_lines_name_is_the_version_built() -> None:
    pages = [ROOT / "README.md", *DOCS.rglob("*.md")]
    named = {(p.name, v) for p in pages for v in re.findall(r"estafeta-([\w.]+)-py3-none-any\.whl", p.read_text())}
    assert {v for _, v in named} == {__version__}, f"install lines name other versions than {__version__}: {named}"


def test_the_readme_is_short_and_links_to_the_site() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    assert "docs/index.md" in readme and "make test" in readme and "make system-deps" in readme


def test_the_performance_page_is_a_page_a_user_reads() -> None:
    """Current figures, how to reproduce them and what did not pay: no chronological log."""
    assert len((DOCS / "performance.md").read_text().splitlines()) <= 300


#: How a build log names its units of work (one of the words below followed by a number,
#: or "this" and one of them, or the tracker's possessive): words that mean nothing to a
#: reader of the code or the docs. Built from parts so that this file does not match itself.
_LOG_UNITS = "|".join(["st" + "op", "is" + "sue", "it" + "em", "tic" + "ket"])
BUILD_LOG = re.compile(
    rf"\b(?:{_LOG_UNITS})s?\s+#?\d|\bthis\s+(?:{'ses' + 'sion'}|{'st' + 'op'})\b|\bthe\s+{'is' + 'sue'}'s\b",
    re.IGNORECASE,
)


def tracked_text_files() -> list[Path]:
    """The repository's tracked files that are text (skipped outside a git checkout)."""
    done = subprocess.run(["git", "ls-files", "-z"], capture_output=True, cwd=ROOT, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"not a git checkout: {done.stderr.decode().strip()}")
    paths = [ROOT / name for name in done.stdout.decode().split("\0") if name]
    return [p for p in paths if p.is_file() and b"\0" not in p.read_bytes()[:8192]]


def test_nothing_tracked_says_how_the_project_was_built() -> None:
    """Code, tests, benchmarks, docs and the CHANGELOG say what a change does and why, not its ticket."""
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in tracked_text_files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if BUILD_LOG.search(line)
    ]
    assert found == [], "build-log words:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    ["Measured at st" + "op 32.", "(is" + "sue 20, it" + "em 7)", "in this ses" + "sion", "The is" + "sue's targets"],
)
def test_the_build_log_pattern_finds_its_words(line: str) -> None:
    assert BUILD_LOG.search(line)


@pytest.mark.parametrize("line", ["stop the relay", "an issue with 2 workers", "step 2", "round 3 (forward)"])
def test_the_build_log_pattern_leaves_plain_words_alone(line: str) -> None:
    assert not BUILD_LOG.search(line)
