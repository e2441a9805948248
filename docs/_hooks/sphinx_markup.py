"""A griffe extension: the docstrings' Sphinx markup rendered as Markdown in the API reference.

estafeta's docstrings are written in reST's Sphinx style. mkdocstrings parses their fields
(``:param x:``) but would show the rest as written. This extension (``mkdocs.yml``, the
Python handler's ``extensions``) rewrites every docstring of the loaded package before it
is rendered, leaving the source alone:

- a role (``:class:`App```, ``:meth:`~Runtime.close```, ``:func:`estafeta.deliver```)
  becomes a cross-reference to the object the name means where the docstring stands (the
  object's members, its parents' and its module's names, imports included), in
  mkdocs-autorefs' form: a link when the object is on a page, the name in code otherwise
  (an object outside estafeta, a private one);
- a paragraph ending in ``::`` ends in ``:`` (or nothing, after a space, as in reST), and
  the indented literal block after it becomes a fenced code block (Python when it parses
  as Python).
"""

from __future__ import annotations

import ast
import html
import re
import textwrap
from typing import Any

import griffe

#: A Sphinx role of the Python domain: ``:class:`target```, ``:py:meth:`~a.b```.
ROLE = re.compile(r":(?:py:)?(?P<kind>class|meth|func|attr|mod|data|exc|obj|const|type):`(?P<text>[^`]+)`")
#: The roles Sphinx shows with parentheses after the name.
CALLABLE_ROLES = frozenset({"meth", "func"})
#: The repository's top-level packages: a dotted name starting with one is a full path.
PROJECT_PACKAGES = frozenset({"estafeta", "estafeta_sql", "estafeta_brokers", "estafeta_cli", "estafeta_actors"})
#: A role's explicit title: ``:class:`the app <App>```.
TITLED = re.compile(r"^(?P<title>.+?)\s*<(?P<target>[^<>]+)>$")


class SphinxMarkup(griffe.Extension):
    """Rewrites each object's docstring once the package's object tree is complete."""

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        rewrite(obj)

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        rewrite(pkg)  # the package itself is not among the objects of ``on_object``


def rewrite(obj: griffe.Object) -> None:
    """Rewrite ``obj``'s docstring in place (once: the rewritten text has nothing left to rewrite)."""
    if obj.docstring is not None:
        obj.docstring.value = to_markdown(obj.docstring.value, obj)


def to_markdown(text: str, scope: griffe.Object) -> str:
    """``text`` with its literal blocks fenced and its roles turned into cross-references."""
    parts = []
    for chunk, is_code in literal_blocks(text):
        parts.append(chunk if is_code else ROLE.sub(lambda match: cross_reference(match, scope), chunk))
    return "\n".join(parts)


def cross_reference(match: re.Match[str], scope: griffe.Object) -> str:
    """One role as mkdocs-autorefs' optional reference: a link if its target is documented."""
    kind, text = match.group("kind"), match.group("text").strip()
    titled = TITLED.match(text)
    if titled:
        title, target = titled.group("title"), titled.group("target").strip()
    else:
        target = text.lstrip("~!")
        title = target.rsplit(".", 1)[-1] if text.startswith("~") else target
        if kind in CALLABLE_ROLES and not title.endswith(")"):
            title += "()"
    identifier = resolve(target.removesuffix("()"), scope)
    return f'<autoref identifier="{html.escape(identifier)}" optional><code>{html.escape(title)}</code></autoref>'


def resolve(target: str, scope: griffe.Object) -> str:
    """The full path of ``target`` as Python would read it in ``scope``, or ``target`` itself.

    A dotted name that starts with one of the project's packages (``estafeta_sql.errors.X``) is
    already a full path, even where a module imported another ``sql`` (psycopg's).
    """
    head, _, rest = target.lstrip(".").partition(".")
    if rest and head in PROJECT_PACKAGES:
        return target
    try:
        path = scope.resolve(head)
    except (griffe.NameResolutionError, griffe.AliasResolutionError, KeyError):
        return target
    return f"{path}.{rest}" if rest else path


def literal_blocks(text: str) -> list[tuple[str, bool]]:
    """``text`` cut into prose and fenced literal blocks: (chunk, is it code)."""
    lines = text.split("\n")
    chunks: list[tuple[str, bool]] = []
    prose: list[str] = []
    i = 0
    while i < len(lines):
        block_end = _literal_block_end(lines, i)
        if block_end is None:
            prose.append(lines[i])
            i += 1
            continue
        intro = lines[i].rstrip()[:-2]
        if intro.strip():
            prose.append(intro.rstrip() if intro.endswith((" ", "\t")) else intro + ":")
        prose.append("")
        chunks.append(("\n".join(prose), False))
        chunks.append((_fence(lines[i + 1 : block_end], _indent(lines[i])), True))
        prose = [""]
        i = block_end
    chunks.append(("\n".join(prose), False))
    return chunks


def _literal_block_end(lines: list[str], i: int) -> int | None:
    """Where the literal block introduced by ``lines[i]`` ends, if that line ends in ``::``."""
    line = lines[i].rstrip()
    if not line.endswith("::") or line.endswith(":::"):
        return None
    indent = _indent(lines[i])
    end = i + 1
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > indent):
        end += 1
    body = [line for line in lines[i + 1 : end] if line.strip()]
    return end if body else None


def _fence(block: list[str], indent: int) -> str:
    code = textwrap.dedent("\n".join(block)).strip("\n")
    language = "python" if _is_python(code) else "text"
    pad = " " * indent
    fenced = [f"{pad}```{language}", *(f"{pad}{line}" if line else "" for line in code.split("\n")), f"{pad}```"]
    return "\n".join([*fenced, ""])


def _is_python(code: str) -> bool:
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())
