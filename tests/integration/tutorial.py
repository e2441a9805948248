"""docs/tutorial.md read as a script: the files its blocks name, and its shell commands in order."""

from __future__ import annotations

import re
import shlex
from functools import cache
from pathlib import Path

import attrs
from sybil import Document
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer

from ..test_docs_examples import SHELL, commands

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "tutorial.md"


@attrs.frozen
class Block:
    """A fenced block: its language, the file its ``title`` names (if any), and its text."""

    language: str
    title: str | None
    source: str

    def content(self) -> str:
        """The text a reader's file gets: the block's, or the files its ``--8<--`` lines include."""
        included = re.findall(r'^\s*--8<--\s+"([^"]+)"\s*$', self.source, re.MULTILINE)
        if included:
            return "".join((ROOT / name).read_text() for name in included)
        return self.source


@attrs.frozen
class Tutorial:
    text: str
    blocks: tuple[Block, ...]

    @staticmethod
    @cache
    def load() -> Tutorial:
        text = PAGE.read_text()
        lexer = FencedCodeBlockLexer(language=r".+", mapping={"language": "info", "source": "source"})
        blocks = []
        for region in lexer(Document(text, str(PAGE))):
            info = str(region.lexemes["info"]).strip()
            title = re.search(r'title="([^"]+)"', info)
            blocks.append(Block(info.split()[0], title.group(1) if title else None, str(region.lexemes["source"])))
        return Tutorial(text, tuple(blocks))

    def write_files(self, project: Path) -> list[Path]:
        """Write every block that names a file into ``project``; return the paths."""
        written = []
        for block in self.blocks:
            if block.title is not None:
                path = project / block.title
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(block.content())
                written.append(path)
        return written

    def shell_commands(self) -> list[list[str]]:
        """Every command of the page's shell blocks, in order, as words."""
        return [words for block in self.blocks if block.language in SHELL for words in commands(block.source)]

    def wheel_install(self) -> tuple[str, str, list[str]]:
        """The page's ``pip install`` of a built wheel: the wheel's file name, its ``[extras]``, the other packages."""
        for words in self.shell_commands():
            wheels = [w for w in words if re.search(r"\.whl(\[[\w,-]+\])?$", w)]
            if words[:2] == ["pip", "install"] and wheels:
                found = re.fullmatch(r"(?:.*/)?([^/\[]+\.whl)(\[[\w,-]+\])?", wheels[0])
                assert found, wheels[0]
                others = [w for w in words[2:] if w != wheels[0] and not w.startswith("-")]
                return found.group(1), found.group(2) or "", others
        raise AssertionError("the tutorial installs no wheel (pip install 'dist/estafeta-....whl[extras]')")

    def statuses_after(self, argv: list[str]) -> list[str]:
        """The saga statuses of the ``text`` block the page shows after the shell block that runs ``argv``."""
        wanted = " ".join(argv)
        for before, after in zip(self.blocks, self.blocks[1:], strict=False):
            ran = [" ".join(words) for words in commands(before.source)] if before.language in SHELL else []
            if wanted in ran and after.language == "text":
                return [line.split()[3] for line in after.source.splitlines() if len(line.split()) > 3]
        raise AssertionError(f"the tutorial shows no output of {shlex.join(argv)}")


def expand(word: str, env: dict[str, str]) -> str:
    """``word`` with ``$NAME`` and ``${NAME}`` replaced by ``env``'s values, as the shell does in double quotes."""
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), ""), word)
