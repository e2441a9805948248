"""The reference pages generated from the code at build time: settings, CLI, metrics.

A page asks for a table with a marker line, ``<!-- generated: settings -->`` (or ``cli``,
``metrics``); :func:`on_page_markdown` (an MkDocs hook, see ``mkdocs.yml``) replaces it.
Nothing here lists a setting, a command or a metric by hand: a field added to
``Settings`` with its ``#:`` comment, a click command with its help, or a metric
defined at module level in ``estafeta`` or ``brokers`` appears on the next build.
``tests/test_docs.py`` fails when one of them has no documentation.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import click
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

MARKER = re.compile(r"^<!-- generated: (\w+) -->$", re.MULTILINE)
#: The packages whose modules define estafeta's metrics.
METRIC_PACKAGES = ("estafeta", "estafeta_brokers", "estafeta_cli", "estafeta_console")
#: Collectors that have no module-level instance: how to make one to ask for its families.
COLLECTOR_FACTORIES: dict[str, Callable[[type[Any]], Collector]] = {
    "TablesCollector": lambda cls: cls([], [], 300.0),
    "LivenessCollector": lambda cls: cls(lambda: None),
}


@attrs.frozen
class SettingDoc:
    """One setting: its attribute, environment variable, default and meaning."""

    name: str
    variable: str
    default: str
    meaning: str


@attrs.frozen
class MetricDoc:
    """One metric family: its name, type, labels, meaning and the module that defines it."""

    name: str
    kind: str
    labels: tuple[str, ...]
    meaning: str
    module: str


@attrs.frozen
class OptionDoc:
    """One option or argument of a command."""

    names: str
    variable: str
    default: str
    help: str


@attrs.frozen
class CommandDoc:
    """One command (``estafeta outbox stats``): usage, help and its options."""

    path: str
    usage: str
    help: str
    options: tuple[OptionDoc, ...]


def doc_comments(source: str) -> dict[str, str]:
    """The ``#:`` comments right above each annotated or assigned name of ``source``."""
    lines = source.splitlines()
    docs: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        else:
            continue
        comment: list[str] = []
        row = node.lineno - 2
        while row >= 0 and lines[row].strip().startswith("#:"):
            comment.insert(0, lines[row].strip().removeprefix("#:").strip())
            row -= 1
        docs[name] = " ".join(comment)
    return docs


def _duration(value: timedelta) -> str:
    seconds = value.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _default(field: Any) -> str:
    default = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return "—"
    if default is None:
        return "—"
    if isinstance(default, timedelta):
        return f"`{_duration(default)}`"
    return f"`{default}`"


def settings() -> list[SettingDoc]:
    """Every field of ``Settings`` and the two variables the CLI reads, in declaration order."""
    from estafeta.app import settings as _settings

    comments = doc_comments(inspect.getsource(_settings))
    rows = [
        SettingDoc("app", _settings.APP_VARIABLE, "`actors`", comments.get("APP_VARIABLE", "")),
        SettingDoc(
            "config", _settings.CONFIG_FILE_VARIABLE, "`estafeta.toml`", comments.get("CONFIG_FILE_VARIABLE", "")
        ),
    ]
    for field in attrs.fields(_settings.Settings):
        variable = (
            "ESTAFETA_<SERVICE>_DATABASE_URL"
            if field.name == "service_database_urls"
            else f"ESTAFETA_{field.name.upper()}"
        )
        rows.append(SettingDoc(field.name, variable, _default(field), comments.get(field.name, "")))
    return rows


def _modules(package: str) -> Iterator[Any]:
    root = importlib.import_module(package)
    yield root
    # Every module at any depth (the runtime's concepts are subpackages); a subpackage whose
    # optional extra is not installed is skipped, as its modules are below.
    for info in pkgutil.walk_packages(root.__path__, f"{package}.", onerror=lambda name: None):
        if info.name.endswith(".__main__"):  # runs its command when imported
            continue
        try:
            yield importlib.import_module(info.name)
        except ImportError:  # an optional extra that is not installed defines no metric
            continue


def metrics() -> list[MetricDoc]:
    """Every metric family the modules of ``estafeta``, ``brokers``, ``cli`` and ``console`` define, by name."""
    found: dict[str, MetricDoc] = {}
    for package in METRIC_PACKAGES:
        for module in _modules(package):
            comments = doc_comments(inspect.getsource(module))
            for name, value in vars(module).items():
                for collector in _collectors(name, value, module.__name__):
                    for family in collector.describe():
                        meaning = comments.get(name, "") if isinstance(value, MetricWrapperBase) else ""
                        help_text = family.documentation.strip()
                        text = help_text if not meaning else f"{help_text}. {meaning}" if help_text else meaning
                        labels = tuple(_labels(value, family))
                        found.setdefault(
                            family.name, MetricDoc(family.name, family.type, labels, text, module.__name__)
                        )
    return sorted(found.values(), key=lambda m: m.name)


def _is_collector_class(value: Any) -> bool:
    # prometheus_client's Collector is a protocol: a class with describe() and collect().
    return inspect.isclass(value) and callable(getattr(value, "describe", None)) and hasattr(value, "collect")


def _collectors(name: str, value: Any, module: str) -> list[Any]:
    if isinstance(value, MetricWrapperBase):
        return [value]
    if not inspect.isclass(value) and _is_collector_class(type(value)) and type(value).__module__ == module:
        return [value]
    if _is_collector_class(value) and value.__module__ == module and value.__name__ in COLLECTOR_FACTORIES:
        return [COLLECTOR_FACTORIES[value.__name__](value)]
    return []


def unknown_collectors() -> list[str]:
    """Collector classes defined in estafeta's modules that :func:`metrics` cannot describe."""
    unknown = []
    for package in METRIC_PACKAGES:
        for module in _modules(package):
            instances = {type(v) for v in vars(module).values() if not inspect.isclass(v)}
            for value in vars(module).values():
                if (
                    _is_collector_class(value)
                    and value.__module__ == module.__name__
                    and value not in instances
                    and value.__name__ not in COLLECTOR_FACTORIES
                ):
                    unknown.append(f"{module.__name__}.{value.__name__}")
    return unknown


def _labels(value: Any, family: Any) -> list[str]:
    if isinstance(value, MetricWrapperBase):
        return list(value._labelnames)
    samples = getattr(family, "_labelnames", ())
    return list(samples)


def cli_group() -> click.Group:
    """The ``estafeta`` group with every command registered (as ``estafeta`` runs it)."""
    from estafeta_cli import main

    main._register()
    return main.cli


def commands(group: click.Group | None = None) -> list[CommandDoc]:
    """Every command and subcommand of ``estafeta``, depth first, with its options."""
    root = group or cli_group()
    found: list[CommandDoc] = []

    def walk(command: click.Command, parent: click.Context | None, name: str) -> None:
        ctx = click.Context(command, info_name=name, parent=parent)
        options = tuple(_option(p, ctx) for p in command.get_params(ctx) if "--help" not in p.opts)
        usage = " ".join(command.collect_usage_pieces(ctx))
        text = inspect.cleandoc(command.help or "").replace("\b\n", "")
        found.append(CommandDoc(ctx.command_path, f"{ctx.command_path} {usage}".strip(), text, options))
        if isinstance(command, click.Group):
            for sub in sorted(command.list_commands(ctx)):
                subcommand = command.get_command(ctx, sub)
                if subcommand is not None and not subcommand.hidden:
                    walk(subcommand, ctx, sub)

    walk(root, None, "estafeta")
    return found


def _option(param: click.Parameter, ctx: click.Context) -> OptionDoc:
    names = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
    variable = f"`{param.envvar}`" if isinstance(param.envvar, str) else ""
    if isinstance(param, click.Argument):  # click arguments have no help: the command's help says what they are
        return OptionDoc(f"`{param.human_readable_name}`", variable, "", "argument (see above)")
    help_text = getattr(param, "help", None) or ""
    default = param.get_default(ctx, call=False)
    unset = default in (None, (), False) or callable(default) or type(default).__name__ == "Sentinel"
    shown = "" if unset else f"`{default}`"
    return OptionDoc(names, variable, shown, help_text)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def settings_markdown() -> str:
    """The settings table."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    rows += [f"| `{s.variable}` | {s.default} | {_cell(s.meaning)} |" for s in settings()]
    return "\n".join(rows)


def metrics_markdown() -> str:
    """The metrics table."""
    rows = ["| metric | type | labels | meaning | defined in |", "|---|---|---|---|---|"]
    rows += [
        f"| `{m.name}` | {m.kind} | {', '.join(f'`{label}`' for label in m.labels) or '—'} | {_cell(m.meaning)}"
        f" | `{m.module}` |"
        for m in metrics()
    ]
    return "\n".join(rows)


def cli_markdown() -> str:
    """A section per command: usage, help, options."""
    parts: list[str] = []
    for command in commands():
        level = "#" * min(2 + command.path.count(" ") - 1, 4) if " " in command.path else "##"
        parts += [f"{level} `{command.path}`", "", "```text", command.usage, "```", "", command.help.strip(), ""]
        if command.options:
            parts += ["| option | variable | default | meaning |", "|---|---|---|---|"]
            parts += [f"| {o.names} | {o.variable} | {o.default} | {_cell(o.help)} |" for o in command.options]
            parts.append("")
    return "\n".join(parts)


GENERATORS: dict[str, Callable[[], str]] = {
    "settings": settings_markdown,
    "metrics": metrics_markdown,
    "cli": cli_markdown,
}


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs hook: replace each ``<!-- generated: NAME -->`` line with its table."""
    return MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)


#: Where this module lives, for tests that load it by path.
PATH = Path(__file__)
