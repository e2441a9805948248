"""The console through a database restart and an outage, on ``estafeta serve``: HTML pages, never a problem document.

A restart is the server's connections terminated (``pg_terminate_backend`` from another
connection): the machine's PostgreSQL is shared and is never restarted. An outage is a
:class:`~tests.tcp_proxy.TcpProxy` between the server and PostgreSQL, stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..helpers import wait_until
from ..http_server import backend_gone, serving
from ..tcp_proxy import TcpProxy

pytestmark = pytest.mark.integration

#: Pages that read every service's database, each its own way.
PAGES = [
    "/console",
    "/console/sagas",
    "/console/charts/frame?window=15",
    "/console/projections",
    "/console/kinds/order",
]


def terminate_the_others(conn: psycopg.Connection[Any]) -> list[int]:
    """End every other backend of ``conn``'s database (the server's pooled connections) and wait until they are gone."""
    pids = [
        int(row[0])
        for row in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    ]
    conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
    for pid in pids:
        backend_gone(conn, pid)
    return pids


def is_html(page: httpx.Response) -> bool:
    return page.headers["Content-Type"].startswith("text/html") and page.text.lstrip().startswith("<!doctype html>")


def test_after_the_servers_connections_are_dropped_the_next_page_is_served_not_a_503(
    database_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    with serving(database_url, tmp_path, "--no-access-log") as server, server.client() as http:
        for path in PAGES:
            first = http.get(path)
            assert first.status_code == 200, (path, first.text[:300])
            assert terminate_the_others(conn), "the server holds no connection to terminate"
            again = http.get(path)
            assert again.status_code == 200, (path, again.text[:300])
            assert is_html(again), path


def test_a_database_out_of_reach_gives_html_pages_with_a_retry_link_and_a_frame_that_reloads_itself(
    database_url: str, tmp_path: Path
) -> None:
    target = conninfo_to_dict(database_url)
    with TcpProxy(str(target.get("host") or "127.0.0.1"), int(target.get("port") or 5432)) as proxy:
        behind = make_conninfo(database_url, host="127.0.0.1", port=proxy.port)
        with serving(behind, tmp_path, "--no-access-log") as server, server.client() as http:
            assert http.get("/console").status_code == 200
            proxy.stop()
            listed = http.get("/console/sagas?status=running")
            frame = http.get("/console/charts/frame?window=15")
            unknown = http.get("/console/no-such-page")
            health = http.get("/health")
            proxy.start()
            wait_until(lambda: http.get("/console").status_code == 200, timeout=60, what="the console back")
    assert listed.status_code == 503 and is_html(listed)
    assert 'id="retry" href="/console/sagas?status=running"' in listed.text
    assert "the database is unavailable" in listed.text and listed.headers["Retry-After"] == "5"
    assert "frame-ancestors 'none'" in listed.headers["Content-Security-Policy"]
    # The charts' frame: framed by the charts page as before, and it keeps reloading itself.
    assert frame.status_code == 503 and is_html(frame)
    assert '<meta http-equiv="refresh" content="10">' in frame.text
    assert "frame-ancestors 'self'" in frame.headers["Content-Security-Policy"]
    assert unknown.status_code == 404 and is_html(unknown) and "/console/no-such-page" in unknown.text
    # The API's answers stay problem documents.
    assert health.status_code == 503 and health.headers["Content-Type"] == "application/problem+json"
