"""Finding and fixing one order in a real headless Chromium, on ``estafeta serve``: search, stuck list, dead letters.

The same pages in process, with every case of each, are in tests/test_console_finding.py.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb

from ..helpers import scalar, wait_until
from ..http_server import serving
from ..tcp_proxy import TcpProxy
from .test_console import OPERATOR, as_operator, browser, click, sagas_in_every_state, stuck_saga, text

__all__ = ["browser"]  # the fixture, used by name

pytestmark = pytest.mark.integration


def test_an_order_id_prefix_finds_the_stuck_saga_and_its_dead_letters_are_replayed_after_a_dry_run(
    database_url: str, conn, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    with serving(database_url, tmp_path, "--allow-actions", "--no-access-log", env=OPERATOR) as server:
        saga_id = stuck_saga(server, conn)
        order_id = str(scalar(conn, "SELECT order_id FROM orders.saga_order WHERE saga_id = %s", saga_id))
        as_operator(browser)
        browser.get(f"{server.url}/console")
        browser.find_element(By.NAME, "saga_id").send_keys(order_id[:8])
        click(browser, "header form button")
        wait_until(lambda: browser.current_url.endswith(f"/console/sagas/{saga_id}"), what="the saga of the order")
        assert text(browser, "#overdue") == "past deadline" and text(browser, "#status") == "running"

        browser.get(f"{server.url}/console")
        click(browser, "#all-stuck")
        wait_until(lambda: "stuck=yes" in browser.current_url, what="every stuck saga")
        assert saga_id in text(browser, "#saga-list")
        assert browser.find_element(By.NAME, "stuck").is_selected()

        with conn.cursor() as cur:
            for _ in range(60):
                cur.execute(
                    "INSERT INTO payments.dead_letters (consumer, message_id, message, reason)"
                    " VALUES ('payments.charge_payment', %s, %s, 'failed 4 times, last: OSError: disk full')",
                    (str(uuid.uuid4()), Jsonb({"args": [{"customer_id": "nobody", "amount_cents": 1}]})),
                )
        click(browser, 'header a[href="/console/dead-letters"]')
        wait_until(lambda: "OSError" in text(browser, "#letter-groups"), what="the dead-letter groups")
        click(browser, '#letter-groups a[href^="/console/dead-letters/payments/"]')
        wait_until(lambda: "disk full" in text(browser, "#parked"), what="the group's first page")
        assert len(browser.find_elements(By.CSS_SELECTOR, "#parked tr[id^=letter-]")) == 50
        click(browser, "#next-page")
        wait_until(lambda: "before=" in browser.current_url, what="the group's second page")
        assert len(browser.find_elements(By.CSS_SELECTOR, "#parked tr[id^=letter-]")) == 10

        click(browser, "#replay")
        wait_until(lambda: "would replay 60" in text(browser, "#would"), what="the replay's dry run")
        assert scalar(conn, "SELECT count(*) FROM payments.outbox") == 0
        assert text(browser, "button[name=confirm]") == "Replay these 60 letters"
        click(browser, "button[name=confirm]")
        wait_until(lambda: "dead letters" in text(browser, "#notice"), what="the replay's notice")
        assert text(browser, "#notice") == "dead letters: 60 replayed"
    assert scalar(conn, "SELECT count(*) FROM payments.outbox") == 60


def test_a_compensated_saga_shows_its_failed_step_in_red_with_a_legend_and_the_kind_counts_its_sagas(
    database_url: str, conn, runtime, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    ids = sagas_in_every_state(runtime, conn)
    with serving(database_url, tmp_path, "--no-access-log") as server:
        browser.get(f"{server.url}/console/sagas/{ids['compensated']}")
        failing = browser.find_element(By.CSS_SELECTOR, 'g.node.failing[data-node="do:charge_payment"] rect')
        assert failing.value_of_css_property("stroke") == "rgb(198, 40, 40)"
        assert "the step that failed" in text(browser, "#legend")
        assert browser.find_element(By.CSS_SELECTOR, "#legend .swatch.failing").size["width"] > 10
        steps = [cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "#timeline td.step")]
        assert "charge_payment → undo place_order" in steps

        browser.get(f"{server.url}/console/kinds/order")
        counts = {
            badge.get_attribute("data-node"): badge.text
            for badge in browser.find_elements(By.CSS_SELECTOR, "#diagram g.count")
        }
        # Running on charge_payment, failed there; compensating on cancel_order's undo; the ends.
        assert counts["do:charge_payment"] == "2" and counts["undo:place_order"] == "1", counts
        assert counts["end:completed"] == "1" and counts["end:compensated"] == "1", counts
        assert "sagas standing on a step now" in text(browser, "#legend")


@pytest.mark.heavy  # waits for the frame's redraws (10 s each) through an outage
def test_the_charts_frame_shows_the_outage_and_redraws_the_charts_once_the_database_is_back(
    database_url: str, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    def in_frame(css: str) -> str:
        return str(
            browser.execute_script(
                "const f = document.getElementById('chart-frame').contentDocument;"
                f"const e = f && f.querySelector({css!r}); return e ? e.textContent : '';"
            )
        )

    target = conninfo_to_dict(database_url)
    with TcpProxy(str(target.get("host") or "127.0.0.1"), int(target.get("port") or 5432)) as proxy:
        behind = make_conninfo(database_url, host="127.0.0.1", port=proxy.port)
        with serving(behind, tmp_path, "--no-access-log") as server:
            browser.get(f"{server.url}/console/charts?window=15")
            wait_until(lambda: in_frame("svg.chart") != "", timeout=30, what="the charts drawn")
            proxy.stop()
            wait_until(lambda: "unavailable" in in_frame("#reason"), timeout=90, what="the frame showing the outage")
            proxy.start()
            wait_until(lambda: in_frame("svg.chart") != "", timeout=90, what="the charts drawn again")
            assert browser.find_elements(By.ID, "chart-frame") != []
