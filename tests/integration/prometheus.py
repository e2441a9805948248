"""A real Prometheus server for integration tests (Debian's ``prometheus`` package)."""

from __future__ import annotations

import json
import re
import shutil
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..services import require
from . import processes
from .relay_faults import free_port

#: The shipped alert rules.
ALERTS = processes.ROOT / "ops" / "prometheus" / "alerts.yml"


def require_prometheus() -> str:
    """The path of the ``prometheus`` server (skips, or fails under CI, without it)."""
    found = shutil.which("prometheus")
    require("Prometheus (apt-get install prometheus)", found is not None, "the prometheus binary is not on PATH")
    assert found is not None
    return found


def quick_rules(directory: Path) -> Path:
    """The shipped alert rules with every ``for:`` shortened to one second."""
    path = directory / "alerts.yml"
    path.write_text(re.sub(r"(?m)^(\s+for:) \S+$", r"\1 1s", ALERTS.read_text()))
    return path


class Prometheus:
    """A Prometheus server of the test's own: scraping ``jobs`` every second, evaluating the rules every second."""

    def __init__(self, binary: str, jobs: Mapping[str, Sequence[str]], log_dir: Path) -> None:
        directory = log_dir / "prometheus"
        directory.mkdir()
        rules = quick_rules(directory)
        scrapes = [{"job_name": job, "static_configs": [{"targets": list(targets)}]} for job, targets in jobs.items()]
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": scrapes,
        }
        (directory / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.port = free_port()
        argv = [
            binary,
            f"--config.file={directory / 'prometheus.yml'}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        self.process = processes.Process("prometheus", argv, {"PATH": "/usr/bin:/bin"}, log_dir)

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>``: its ``data`` (``None`` while the server is not up yet)."""
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.loads(response.read())
        except OSError:
            return None
        return body["data"] if body.get("status") == "success" else None

    def query(self, expr: str) -> dict[str, float]:
        """An instant query: value by the series' ``instance`` (or ``job``, or ``""``)."""
        data = self.api("query", query=expr) or {"result": []}
        return {r["metric"].get("instance", r["metric"].get("job", "")): float(r["value"][1]) for r in data["result"]}

    def firing(self, alertname: str) -> list[dict[str, str]]:
        """The labels of each firing alert named ``alertname``."""
        data = self.api("alerts") or {"alerts": []}
        return [a["labels"] for a in data["alerts"] if a["labels"]["alertname"] == alertname and a["state"] == "firing"]
