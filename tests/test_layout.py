"""The house's shape: no module of the packages is longer than a reader takes in at once."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The packages the rule covers (tests, benchmarks and examples are exempt).
PACKAGES = ["estafeta", "actors", "brokers", "sql", "cli", "console"]
#: The longest a module may be. Past it, split along the concepts inside (see docs/contributing.md).
MAX_LINES = 400


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_longer_than_400_lines(package: str) -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / package).rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"modules over {MAX_LINES} lines (split them along their concepts): {long}"


def test_every_package_is_in_the_distribution_under_its_installed_name() -> None:
    """A mapped folder cannot be found by name: pyproject lists every package, and this keeps the list whole."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        setuptools = tomllib.load(file)["tool"]["setuptools"]
    folders = {folder: name for name, folder in setuptools["package-dir"].items()}
    inits = [init for package in PACKAGES for init in (ROOT / package).rglob("__init__.py")]
    parts = [init.parent.relative_to(ROOT).parts for init in inits]
    found = {".".join([folders.get(top, top), *rest]) for top, *rest in parts}
    assert found - set(setuptools["packages"]) == set()
