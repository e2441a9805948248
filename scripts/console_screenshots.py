"""Take the documentation's pictures of the operator console: ``python scripts/console_screenshots.py``.

The same data as ``python -m bench.console_pages`` (sagas in every state on a scratch
database, a dead letter, a failed row, a scheduled message, a projection), served by
``estafeta serve`` and drawn in Debian's headless Chromium; each page's PNG goes to
``docs/img/console-<page>.png`` (see docs/operations/console.md). Run it again after
changing a page; the pictures are documentation and are committed.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import scratch_database  # noqa: E402
from bench.console_pages import chromium, fill, prepare, serving  # noqa: E402

#: (file name, path, window height): the pages the documentation shows.
SHOTS = [
    ("overview", "/console", 1000),
    ("sagas", "/console/sagas?kind=order", 760),
    ("saga", "/console/sagas/{compensated}", 1060),
    ("kind", "/console/kinds/order", 760),
    ("dead-letters", "/console/dead-letters", 420),
    ("charts", "/console/charts?window=60", 900),
    ("projections", "/console/projections", 480),
    ("events", "/console/events?service=orders&stream={stream}", 760),
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="where the PNGs go")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "host=127.0.0.1 port=5432 user=postgres dbname=test"),
        help="a PostgreSQL server to create a scratch database on",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with scratch_database(args.database_url, prepare) as dsn:
        ids = fill(dsn, 1000)
        with serving(dsn) as url, chromium(width=1280, height=900) as browser:
            for name, path, height in SHOTS:
                browser.set_window_size(1280, height)
                browser.get(url + path.format(**ids))
                if name == "charts":  # the frame draws after the page
                    browser.implicitly_wait(2)
                    browser.switch_to.frame(browser.find_element("id", "chart-frame"))
                    browser.find_element("css selector", "svg.chart")
                    browser.switch_to.default_content()
                target = args.out / f"console-{name}.png"
                browser.save_screenshot(str(target))
                print(f"{target.relative_to(ROOT)}: {target.stat().st_size // 1024} KiB")


if __name__ == "__main__":
    main()
