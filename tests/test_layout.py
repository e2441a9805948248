"""The house's shape: no module of the packages is longer than a reader takes in at once."""

from __future__ import annotations

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
