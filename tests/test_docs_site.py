"""The built documentation site: it builds with no warning, and no page shows reST markup.

The docstrings are written in reST's Sphinx style; the API reference renders them through
``docs/_hooks/sphinx_markup.py`` (a griffe extension), which turns their roles into
cross-references and their ``::`` literal blocks into code blocks. A role or a ``::``
left in a page's prose is markup the reader sees raw.
"""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_hooks"))
from sphinx_markup import literal_blocks  # noqa: E402

#: A Sphinx role of the Python domain, as the reader would see it raw.
RAW_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|data|exc|obj|const|type):")
#: Elements whose text is code, where ``::`` and role-like text may stand as written.
CODE = re.compile(r"<(pre|code|script|style)\b.*?</\1>", re.DOTALL)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built as ``make docs`` builds it (strict: a warning fails the build)."""
    if importlib.util.find_spec("mkdocs") is None and not os.environ.get("CI"):
        pytest.skip("mkdocs is not installed (the docs extra)")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "--site-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    return out


def prose(page: Path) -> str:
    """A built page's text outside code, its entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", " ", CODE.sub(" ", page.read_text())))


def test_no_built_page_shows_a_raw_role_or_a_literal_block_marker(site: Path) -> None:
    found = {
        str(page.relative_to(site)): sorted(set(RAW_ROLE.findall(text)) | ({"::"} if "::" in text else set()))
        for page in site.rglob("*.html")
        if (text := prose(page)) and (RAW_ROLE.search(text) or "::" in text)
    }
    assert found == {}


def test_the_api_reference_links_its_cross_references(site: Path) -> None:
    """The package docstring's first line names :class:`App`: on the page, a link to App."""
    page = (site / "reference" / "api" / "index.html").read_text()
    assert re.search(r'assemble them into an <a [^>]*href="#estafeta\.App"', page)
    assert re.search(r'<a [^>]*href="#estafeta\.App\.bind"', page)
    assert len(re.findall(r'class="autorefs autorefs-internal"', page)) > 100


def test_a_literal_block_becomes_a_fenced_block_after_its_paragraph() -> None:
    text = "Bind it::\n\n    app.bind(runtime)\n\nThen run ::\n\n    $ estafeta relay\n\nDone."
    chunks = literal_blocks(text)
    assert [code for _, code in chunks] == [False, True, False, True, False]
    assert chunks[0][0].startswith("Bind it:\n") and "::" not in chunks[2][0]
    assert chunks[1][0].startswith("```python\napp.bind(runtime)\n```")
    assert chunks[3][0].startswith("```text\n$ estafeta relay\n```")
    assert chunks[2][0].strip() == "Then run" and chunks[4][0].strip() == "Done."
