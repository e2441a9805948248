"""Every Python and shell block of the documentation (``docs/`` and ``README.md``) runs or is checked.

Sybil finds the blocks (its Markdown lexers: fenced blocks, and ``<!-- invisible-code-block:
python -->`` comments for set-up a reader need not see); this module says what each kind
must do, page by page, in the page's own namespace:

- a Python block runs, with the suite's ``runtime`` fixture in its namespace (a scratch
  database with every app migrated, emptied first), but the sketches listed in
  :data:`SKETCHES`, which are only compiled; a block whose fence names a file
  (`` ```python title="examples/booking/__init__.py" ``) is a quote, and must be a verbatim
  piece of that file (docstrings aside), which the suite runs; a block of ``--8<--`` lines is
  an include of files that must exist (MkDocs inserts them); on a page written as the
  reader's own project (:data:`READERS_PAGES`), a block whose fence names a file is one of
  that project's files, compiled here and run outside the repository by
  ``tests/integration/test_install.py``;
- a shell block's commands are checked against the code: ``estafeta`` commands and their
  options exist (read-only ones with no placeholder run, in process, on the scratch
  database), ``make`` targets exist, ``pip install`` extras exist, ``dramatiq`` and
  ``python -m`` modules import, ``ESTAFETA_*`` variables are settings. A command of a tool
  outside the project (``curl``, ``tansu``) is allowed by name in :data:`EXTERNAL`.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import textwrap
import tomllib
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import click
import pytest
from sybil import Document, Example, Region, Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.abstract.lexers import LexerCollection
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer, FencedCodeBlockLexer

from .helpers import without_docstrings
from .test_docs import reference

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"])
#: Tools outside the project that documented shell sessions use: not checked.
EXTERNAL = {"curl", "tansu", "sudo", "cd", "git", "django-admin", "createdb", "psql", "pytest"}
#: Pages written as the reader's own project (files named by ``title="..."`` that the repository
#: does not have): tests/integration/test_install.py writes and runs them outside the repository.
READERS_PAGES = {"docs/tutorial.md"}
#: The reader's package of those pages, and the repository's module with the same files.
READERS_MODULES = {"hotel": "examples.booking"}
#: Python blocks that sketch an API with placeholders (``OrderCreated(...)``) and are not
#: run yet, by page and first line: each is compiled, and must still be on its page. Turning
#: one into a runnable block (an invisible set-up block, real arguments) or a quote of the
#: code it sketches removes it from here.
SKETCHES = {
    ("docs/concepts/event-sourcing.md", 'orders.load(conn, "order-42", version=3)  # after its third event'),
    ("docs/concepts/locks.md", "from estafeta import redis_lock"),
    ("docs/how-to/eventsourcing-library.md", "env = {"),
    ("docs/how-to/eventsourcing-library.md", "with psycopg.connect(dsn) as conn:  # one transaction"),
    ("docs/how-to/eventsourcing-library.md", "@bank.step(Deposit, lock=lambda c: c.account_id)"),
    ("docs/how-to/django.md", "import django"),
}
SHELL = {"sh", "bash", "shell", "console"}


class DocBlocks:
    """A Sybil parser: the Python and shell blocks of a Markdown page, with their fence's info line."""

    def __init__(self) -> None:
        self.lexers = LexerCollection(
            [
                FencedCodeBlockLexer(language=r".+", mapping={"language": "info", "source": "source"}),
                DirectiveInHTMLCommentLexer(
                    directive=r"invisible-code-block",
                    arguments=r"python",
                    mapping={"arguments": "info", "source": "source"},
                ),
            ]
        )
        self.python = PythonEvaluator(["annotations"])

    def __call__(self, document: Document) -> Iterable[Region]:
        for region in self.lexers(document):
            info = region.lexemes["info"].strip()
            language = info.split()[0] if info else ""
            if language == "python":
                region.evaluator = self._python(info)
            elif language in SHELL:
                region.evaluator = check_shell
            elif language == "sql" and "title=" in info:
                region.evaluator = self._sql(info)
            else:
                continue
            region.parsed = region.lexemes["source"]
            yield region

    def _sql(self, info: str) -> Any:
        """A SQL block whose fence names a file: an include, a file of the reader's project, or a quote."""
        title = re.search(r'title="([^"]+)"', info)
        assert title is not None

        def evaluate(example: Example) -> None:
            source = str(example.parsed)
            if source.lstrip().startswith("--8<--"):
                check_includes(source)
            elif str(Path(example.path).relative_to(ROOT)) not in READERS_PAGES:
                path = ROOT / title.group(1)
                assert path.is_file(), f"the quoted file {path} does not exist"
                assert source.strip() in path.read_text(), f"not a verbatim piece of {path}:\n{source}"

        return evaluate

    def _python(self, info: str) -> Any:
        title = re.search(r'title="([^"]+)"', info)

        def evaluate(example: Example) -> None:
            source = str(example.parsed)
            first = next((line for line in source.splitlines() if line.strip()), "")
            page = str(Path(example.path).relative_to(ROOT))
            if (page, first) in SKETCHES:
                example.namespace["_sketches"].add((page, first))
                compile(textwrap.dedent(source), example.path, "exec")
            elif source.lstrip().startswith("--8<--"):
                check_includes(source)
            elif title and page in READERS_PAGES:
                # A file of the reader's project: run there by tests/integration/test_install.py.
                compile(textwrap.dedent(source), title.group(1), "exec")
            elif title:
                check_quote(source, ROOT / title.group(1))
            else:
                example.namespace.setdefault("runtime", example.namespace["_fixture"]("runtime"))
                self.python(example)

        return evaluate


def check_quote(block: str, path: Path) -> None:
    """Each top-level part of ``block`` is a verbatim piece of ``path``, the file's docstrings left out.

    Parts are separated by two blank lines, as ruff formats top-level definitions: a quote
    may leave definitions out between them.
    """
    assert path.is_file(), f"the quoted file {path} does not exist"
    source = textwrap.dedent(without_docstrings(path.read_text()))
    for part in textwrap.dedent(block).split("\n\n\n"):
        assert part.strip() in source, f"not a verbatim piece of {path}:\n{part}"


def check_includes(block: str) -> None:
    for line in block.splitlines():
        name = re.match(r'\s*--8<--\s+"([^":]+)', line)
        assert name, f"not an include line: {line!r}"
        assert (ROOT / name.group(1)).is_file(), f"{name.group(1)} does not exist"


def commands(block: str) -> Iterator[list[str]]:
    """The commands of a shell block: ``$ `` lines of a session, else every line; comments dropped."""
    text = block.replace("\\\n", " ")
    lines = text.splitlines()
    if any(line.lstrip().startswith("$ ") for line in lines):
        lines = [line.lstrip()[2:] for line in lines if line.lstrip().startswith("$ ")]
    for line in lines:
        words = shlex.split(line, comments=True)
        if words:
            yield words


def check_shell(example: Example) -> None:
    for words in commands(str(example.parsed)):
        check_command(words, example.namespace)


def check_command(words: list[str], namespace: dict[str, Any]) -> None:
    """Check one command line against the code (and run it when it is a read-only estafeta command)."""
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value command
        check_variable(words.pop(0).split("=", 1)[0])
    if not words:
        return
    tool, args = words[0], words[1:]
    if tool == "export":
        for assignment in args:
            check_variable(assignment.split("=", 1)[0])
    elif tool == "estafeta":
        check_estafeta(args, namespace)
    elif tool == "opentelemetry-instrument":
        check_command(args, namespace)
    elif tool == "make":
        targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))
        assert set(args) <= targets, f"make {' '.join(args)}: no such target"
    elif tool == "pip":
        check_pip(args)
    elif tool == "dramatiq":
        check_module(args[0].split(":")[0])
    elif tool in ("python", "python3") and args[:1] == ["-m"]:
        check_module(args[1])
    elif tool in ("python", "python3") and args[:1] and args[0].endswith(".py"):
        pass  # a script of the reader's, shown on its page
    else:
        assert tool in EXTERNAL, f"{tool}: neither a command of this project nor a known external tool"


def check_variable(name: str) -> None:
    if not name.startswith("ESTAFETA_"):
        return
    known = {s.variable for s in reference().settings()}
    assert name in known or re.match(r"^ESTAFETA_[A-Z0-9_]+_DATABASE_URL$", name), f"{name} is not a setting"


def check_module(name: str) -> None:
    name = READERS_MODULES.get(name, name)
    assert importlib.util.find_spec(name) is not None, f"no module {name}"


def check_pip(args: list[str]) -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for arg in args:
        # estafeta[x], from an index; ./estafeta[x], a clone; dist/estafeta-V-py3-none-any.whl[x], a wheel.
        asked = re.match(r"^(?:.*/)?estafeta(?:-[^/\[]+\.whl)?\[([a-z,\-]+)\]$", arg)
        if asked:
            assert set(asked.group(1).split(",")) <= extras, f"{arg}: no such extra"


def check_estafeta(args: list[str], namespace: dict[str, Any]) -> None:
    """The command path and every ``--option`` named exist."""
    group = reference().cli_group()
    command: click.Command = group
    path: list[str] = []
    ctx = click.Context(group, info_name="estafeta")
    rest = list(args)
    while rest:
        if _is_option_of(rest[0], command, ctx):
            rest.pop(0)
            continue
        if isinstance(command, click.Group) and not rest[0].startswith("-"):
            sub = command.get_command(ctx, rest[0])
            assert sub is not None, f"estafeta {' '.join(path)}: no command {rest[0]!r}"
            path.append(rest.pop(0))
            command = sub
            ctx = click.Context(command, info_name=path[-1], parent=ctx)
            continue
        if rest[0].startswith("--"):
            raise AssertionError(f"estafeta {' '.join(path)}: no option {rest[0].split('=')[0]}")
        rest.pop(0)  # a value or an argument


def _is_option_of(word: str, command: click.Command, ctx: click.Context) -> bool:
    if not word.startswith("-") or word in ("-h", "--help"):
        return word in ("-h", "--help")
    name = word.split("=", 1)[0]
    return any(name in p.opts or name in p.secondary_opts for p in command.get_params(ctx))


@cache
def _sybil() -> Sybil:
    return Sybil(parsers=[DocBlocks()], patterns=["*.md"])


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_the_page_blocks_run_or_match_the_code(page: Path, request: pytest.FixtureRequest) -> None:
    document = _sybil().parse(page)
    document.namespace["_fixture"] = request.getfixturevalue
    document.namespace["_sketches"] = found = set()
    for example in document.examples():
        example.evaluate()
    listed = {sketch for sketch in SKETCHES if sketch[0] == str(page.relative_to(ROOT))}
    assert listed == found, f"SKETCHES lists blocks no longer on the page: {listed - found}"
