"""The operator console in a real headless Chromium (Debian's, through chromedriver), on ``estafeta serve``."""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb

from ..helpers import scalar, wait_until
from ..http_server import Server, free_port, serving
from ..services import require

pytestmark = pytest.mark.integration

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
#: Flags that work in a container as root, with no network beyond loopback.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
]
ORDER = {"customer_id": "c1", "sku": "s1", "quantity": 1, "amount_cents": 700}
#: The operator's password of the consoles that act (never on the command line).
PASSWORD = "correct horse battery staple"
OPERATOR = {"ESTAFETA_CONSOLE_PASSWORD": PASSWORD}


def as_operator(browser: Any) -> None:
    """Have the browser send the operator's password with every request, as it does once its prompt is answered.

    A headless browser cannot answer the Basic auth prompt, and Chromium does not reuse
    credentials written in a URL for the form posts that follow: the DevTools protocol
    sets the header instead.
    """
    credential = base64.b64encode(f"operator:{PASSWORD}".encode()).decode()
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {credential}"}})


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """A headless Chromium driven by chromedriver, with a fresh profile."""
    require(
        "Chromium",
        CHROMIUM.exists() and CHROMEDRIVER.exists(),
        "apt-get install -y chromium chromium-driver (.ci/run does)",
    )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in [*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def stuck_saga(server: Server, conn: psycopg.Connection[Any]) -> str:
    """Place an order over HTTP and push its saga past its deadline (no worker runs: it stays stuck)."""
    with server.client() as http:
        placed = http.post("/orders", json=ORDER, headers={"Idempotency-Key": str(uuid.uuid4())})
    saga_id = placed.json()["saga_id"]
    conn.execute(
        "UPDATE orders.saga_order SET deadline_at = now() - interval '2 minutes' WHERE saga_id = %s", (saga_id,)
    )
    return str(saga_id)


def text(browser: Any, css: str) -> str:
    """The element's text; empty while the page holding it is still loading (after a click)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return str(browser.find_element(By.CSS_SELECTOR, css).text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def click(browser: Any, css: str) -> None:
    from selenium.webdriver.common.by import By

    browser.find_element(By.CSS_SELECTOR, css).click()


@pytest.mark.heavy
def test_the_console_shows_a_stuck_saga_and_resumes_it_when_actions_are_allowed(
    database_url: str, conn, browser: Any, tmp_path: Path
) -> None:
    with serving(database_url, tmp_path, "--allow-actions", "--no-access-log", env=OPERATOR) as server:
        saga_id = stuck_saga(server, conn)
        as_operator(browser)
        browser.get(f"{server.url}/console")
        assert "estafeta console" in browser.title
        assert saga_id in text(browser, "#stuck")
        assert "charge_payment" in text(browser, f"#stuck #saga-{saga_id}")

        click(browser, f"#stuck #saga-{saga_id} button[name=resume]")
        wait_until(lambda: browser.current_url.startswith(f"{server.url}/console/sagas/{saga_id}"), what="saga page")
        assert text(browser, "#notice") == "resumed: resent"
        assert "resumed" in text(browser, "#timeline")

        browser.get(f"{server.url}/console")
        assert saga_id not in text(browser, "#stuck")
    version, overdue = conn.execute(
        "SELECT version, deadline_at <= now() FROM orders.saga_order WHERE saga_id = %s", (saga_id,)
    ).fetchone()
    assert (version, overdue) == (2, False)
    assert scalar(conn, "SELECT count(*) FROM orders.outbox WHERE saga_id = %s", saga_id) == 2  # sent again


@pytest.mark.heavy
def test_failed_rows_are_retried_and_a_saga_aborted_from_the_console(
    database_url: str, conn, browser: Any, tmp_path: Path
) -> None:
    with serving(database_url, tmp_path, "--allow-actions", "--no-access-log", env=OPERATOR) as server:
        saga_id = stuck_saga(server, conn)
        conn.execute("UPDATE orders.outbox SET status = 'failed', attempts = 5, last_error = 'connection refused'")
        as_operator(browser)
        browser.get(f"{server.url}/console")
        assert "connection refused" in text(browser, "#failed-rows")
        click(browser, "#failed-rows td button")
        wait_until(lambda: "back to pending" in text(browser, "#notice"), what="the retry's notice")
        assert text(browser, "#notice") == "1 outbox row(s) back to pending"
        assert scalar(conn, "SELECT status FROM orders.outbox") == "pending"

        parked = {"args": [{"order_id": str(uuid.uuid4()), "customer_id": "nobody", "amount_cents": 100}]}
        conn.execute(
            "INSERT INTO payments.dead_letters (consumer, message_id, message, reason) VALUES (%s, %s, %s, %s)",
            ("payments.charge_payment", str(uuid.uuid4()), Jsonb(parked), "failed 4 times, last: OSError: disk full"),
        )
        browser.get(f"{server.url}/console")
        assert "OSError: disk full" in text(browser, "#dead-letters")
        click(browser, "#dead-letters td a.replay")  # its dry run first, then the confirmation
        wait_until(lambda: "would replay" in text(browser, "#would"), what="the replay's dry run")
        click(browser, "button[name=confirm]")
        wait_until(lambda: "dead letters" in text(browser, "#notice"), what="the replay's notice")
        assert text(browser, "#notice") == "dead letters: 1 replayed"
        assert scalar(conn, "SELECT status FROM payments.dead_letters") == "replayed"
        assert scalar(conn, "SELECT message #>> '{options,replay_of}' FROM payments.outbox") is not None

        browser.get(f"{server.url}/console/sagas/{saga_id}")
        browser.find_element("css selector", "input[name=reason]").send_keys("customer called")
        click(browser, "button[name=abort]")
        wait_until(lambda: "aborted" in text(browser, "#notice"), what="the abort's notice")
        assert text(browser, "#status") == "compensating"
    assert scalar(conn, "SELECT last_error FROM orders.saga_order") == "aborted: customer called"


def test_without_allow_actions_the_console_only_reads(database_url: str, conn, browser: Any, tmp_path: Path) -> None:
    with serving(database_url, tmp_path, "--no-access-log") as server:
        saga_id = stuck_saga(server, conn)
        for n in (17, 18, 19):
            conn.execute(
                "INSERT INTO payments.dead_letters (consumer, message_id, message, reason) VALUES (%s, %s, '{}', %s)",
                ("payments.charge_payment", str(uuid.uuid4()), f"not a valid ChargePayment: amount {n} <b>x</b>"),
            )
        browser.get(f"{server.url}/console")
        assert saga_id in text(browser, "#stuck")
        assert "read-only" in text(browser, "header")
        assert browser.find_elements("css selector", "button[name=resume]") == []
        causes = text(browser, "#dead-letters")
        # Escaped, and grouped as `estafeta dead-letters groups` groups them.
        assert "payments.charge_payment 3 InvalidMessage: not a valid ChargePayment: amount <n> <b>x</b>" in causes
        assert browser.find_elements("css selector", "button[name=replay]") == []

        browser.get(f"{server.url}/console/sagas/{saga_id}")
        assert text(browser, "#status") == "running"
        assert browser.find_elements("css selector", "form") != [] and "Resume" not in browser.page_source
        # The console's one script runs (its hash matches the page's policy): times in local time.
        assert all("UTC" not in shown and aged(shown) for _, shown in local_times(browser))

        refused = httpx.post(f"{server.url}/console/sagas/{saga_id}/resume", data={"token": "x"})
        assert refused.status_code in (404, 405)
    assert scalar(conn, "SELECT version FROM orders.saga_order") == 1


def test_an_action_without_the_console_form_token_is_refused(database_url: str, conn, tmp_path: Path) -> None:
    with serving(database_url, tmp_path, "--allow-actions", "--no-access-log", env=OPERATOR) as server:
        saga_id = stuck_saga(server, conn)
        operator = ("operator", PASSWORD)
        forged = httpx.post(f"{server.url}/console/sagas/{saga_id}/resume", data={"token": "guessed"}, auth=operator)
        page = httpx.get(f"{server.url}/console", auth=operator)
    assert forged.status_code == 403
    assert (
        page.headers["X-Frame-Options"] == "DENY"
        and "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    )
    assert scalar(conn, "SELECT version FROM orders.saga_order") == 1


def test_any_app_gets_its_console_and_health_without_the_order_api(database_url: str, runtime, tmp_path: Path) -> None:
    with serving(database_url, tmp_path, "--no-access-log", app="examples.booking") as server:
        page = httpx.get(f"{server.url}/console")
        orders = httpx.post(f"{server.url}/orders", json=ORDER, headers={"Idempotency-Key": "k"})
        paths = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    assert page.status_code == 200
    assert "booking · estafeta console" in page.text and "desk" in page.text  # its service and its saga kind
    assert orders.status_code in (404, 405) and orders.headers["Content-Type"] == "application/problem+json"
    assert sorted(paths) == ["/health"]


def form_token(page: str) -> str:
    """The form token a console page hands out."""
    match = re.search(r'name="token" value="([^"]+)"', page)
    assert match, "no form token on the page"
    return match.group(1)


def test_every_console_route_asks_for_the_operator_password_when_actions_are_allowed(
    database_url: str, conn, tmp_path: Path
) -> None:
    with serving(database_url, tmp_path, "--allow-actions", env=OPERATOR) as server:
        saga_id = stuck_saga(server, conn)
        resume = f"{server.url}/console/sagas/{saga_id}/resume"
        anonymous = httpx.get(f"{server.url}/console")
        wrong = httpx.get(f"{server.url}/console", auth=("operator", "guessed"))
        page = httpx.get(f"{server.url}/console", auth=("anyone", PASSWORD))
        token = form_token(page.text)
        # Even with a valid form token, an action without the password does nothing.
        refused = httpx.post(resume, data={"token": token})
        assert scalar(conn, "SELECT version FROM orders.saga_order") == 1
        done = httpx.post(resume, data={"token": token}, auth=("anyone", PASSWORD))
        log = server.process.output()
    assert anonymous.status_code == wrong.status_code == refused.status_code == 401
    assert anonymous.headers["WWW-Authenticate"].startswith('Basic realm="estafeta console"')
    assert anonymous.headers["Content-Type"].startswith("text/html") and token not in anonymous.text
    assert page.status_code == 200 and done.status_code == 303
    assert scalar(conn, "SELECT version FROM orders.saga_order") == 2
    assert PASSWORD not in log
    assert f"POST /console/sagas/{saga_id}/resume by operator 'anyone'" in log


def test_allow_actions_without_an_operator_password_refuses_to_start(database_url: str, tmp_path: Path) -> None:
    from ..integration.processes import service_env
    from ..test_cli import run

    result = run(service_env(database_url, "stub://"), "serve", "--allow-actions", "--port", "1")
    assert result.returncode == 2, result.stderr
    assert "--allow-actions needs an operator password: set ESTAFETA_CONSOLE_PASSWORD" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    empty = run(service_env(database_url, "stub://", ESTAFETA_CONSOLE_PASSWORD_FILE=str(tmp_path)), "serve")
    assert empty.returncode == 2 and "ESTAFETA_CONSOLE_PASSWORD_FILE" in empty.stderr


def test_a_short_operator_password_refuses_to_start_naming_the_variable_not_the_value(database_url: str) -> None:
    from ..integration.processes import service_env
    from ..test_cli import run

    short = run(service_env(database_url, "stub://", ESTAFETA_CONSOLE_PASSWORD="s3cret"), "serve", "--allow-actions")
    assert short.returncode == 2, short.stderr
    assert len(short.stderr.strip().splitlines()) == 1
    assert "ESTAFETA_CONSOLE_PASSWORD: is too short" in short.stderr and "s3cret" not in short.stderr


def sign_in_failures(metrics_url: str) -> dict[str, float]:
    """The console's refused sign-ins by outcome, as the serve process's metrics say."""
    found = {}
    for line in httpx.get(metrics_url).text.splitlines():
        match = re.match(r'estafeta_console_sign_in_failures_total\{outcome="(\w+)"\} (\S+)', line)
        if match:
            found[match.group(1)] = float(match.group(2))
    return found


def test_wrong_passwords_are_slowed_then_locked_out_per_client_and_counted_not_logged(
    database_url: str, tmp_path: Path
) -> None:
    metrics_port = free_port()
    args = ("--allow-actions", "--no-access-log", "--metrics-port", str(metrics_port))
    with serving(database_url, tmp_path, *args, env=OPERATOR) as server:
        console = f"{server.url}/console"
        answers = [httpx.get(console, auth=("operator", f"guess {n}")) for n in range(10)]
        locked = httpx.get(console, auth=("operator", PASSWORD))  # the right password, too late
        # Another client (another loopback address) is not locked out by this one's guesses.
        elsewhere = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"))
        with elsewhere:
            other = elsewhere.get(console, auth=("operator", PASSWORD))
        counted = sign_in_failures(f"http://127.0.0.1:{metrics_port}/metrics")
        log = server.process.output()
    assert [answer.status_code for answer in answers[:3]] == [401, 401, 401]  # a typo or two costs nothing
    assert {answer.status_code for answer in answers[3:9]} <= {401, 429}
    assert answers[9].status_code == locked.status_code == 429
    assert "locked out" in locked.text and int(locked.headers["Retry-After"]) > 60
    assert other.status_code == 200
    assert counted["wrong_password"] + counted["throttled"] == 10 and counted["locked_out"] >= 1
    # One line for the lockout, none per guess, and never a password.
    assert log.count("locked out for 900 s after 10 failed attempts") == 1 and "no valid operator password" not in log
    assert "guess" not in log and PASSWORD not in log


def test_a_notice_written_by_a_link_is_not_shown(database_url: str, conn, tmp_path: Path) -> None:
    spoof = "Outbox corrupted: run estafeta outbox purge --all"
    with serving(database_url, tmp_path, "--allow-actions", "--no-access-log", env=OPERATOR) as server:
        saga_id = stuck_saga(server, conn)
        with server.client(auth=("operator", PASSWORD)) as http:
            spoofed = http.get("/console", params={"notice": spoof, "sig": "0" * 64})
            unsigned = http.get(f"/console/sagas/{saga_id}", params={"notice": spoof})
            token = form_token(http.get("/console").text)
            done = http.post(f"/console/sagas/{saga_id}/resume", data={"token": token})
            shown = http.get(done.headers["Location"])
    assert spoofed.status_code == unsigned.status_code == 200
    assert spoof not in spoofed.text and spoof not in unsigned.text and 'id="notice"' not in spoofed.text
    assert done.status_code == 303 and '<p class="notice" id="notice">resumed: resent</p>' in shown.text


def test_the_console_on_a_listener_of_its_own_is_not_served_on_the_api_port(
    database_url: str, conn, tmp_path: Path
) -> None:
    console_port = free_port()
    with serving(database_url, tmp_path, "--console-port", str(console_port), "--no-access-log") as server:
        console = f"http://127.0.0.1:{console_port}"
        on_api = httpx.get(f"{server.url}/console")
        api = httpx.get(f"{server.url}/openapi.json")
        on_console = httpx.get(f"{console}/console")
        orders = httpx.post(f"{console}/orders", json=ORDER, headers={"Idempotency-Key": "k"})
        health = httpx.get(f"{console}/health")
    assert on_api.status_code == 404 and on_api.headers["Content-Type"] == "application/problem+json"
    assert api.status_code == 200 and on_console.status_code == 200 and health.status_code == 200
    assert "estafeta console" in on_console.text
    assert orders.status_code == 404
    assert scalar(conn, "SELECT count(*) FROM orders.orders") == 0


@pytest.mark.heavy
def test_a_count_leads_to_its_list_to_the_saga_and_its_diagram_drawn_with_the_path_taken(
    database_url: str, conn, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    with serving(database_url, tmp_path, "--no-access-log") as server:
        saga_id = stuck_saga(server, conn)  # running, waiting on charge_payment
        other = stuck_saga(server, conn)
        conn.execute(
            "UPDATE orders.saga_order SET status = 'failed', last_error = 'disk full' WHERE saga_id = %s", (other,)
        )
        browser.get(f"{server.url}/console")
        click(browser, '#sagas a[href="/console/sagas?kind=order&status=running"]')
        wait_until(lambda: "/console/sagas?" in browser.current_url, what="the list of running order sagas")
        assert saga_id in text(browser, "#saga-list") and other not in text(browser, "#saga-list")

        # Each filter of the form: the failed one by its error text, none by a step it is not at.
        browser.get(f"{server.url}/console/sagas")
        browser.find_element(By.NAME, "error").send_keys("DISK")
        click(browser, "#filters button")
        wait_until(lambda: "error=DISK" in browser.current_url, what="the filtered list")
        assert other in text(browser, "#saga-list") and saga_id not in text(browser, "#saga-list")
        browser.find_element(By.NAME, "step").send_keys("reserve_inventory")
        click(browser, "#filters button")
        wait_until(lambda: "step=reserve_inventory" in browser.current_url, what="the list by step")
        assert "no saga matches these filters" in text(browser, "#saga-list")

        browser.get(f"{server.url}/console/sagas?status=running")
        click(browser, f"#saga-{saga_id} a.id")
        wait_until(lambda: browser.current_url.endswith(f"/console/sagas/{saga_id}"), what="the saga's page")
        drawing = browser.find_element(By.CSS_SELECTOR, "#diagram svg")
        assert drawing.size["width"] > 800 and drawing.size["height"] > 250  # laid out and drawn
        standing = browser.find_element(By.CSS_SELECTOR, 'g.node.current[data-node="do:charge_payment"] rect')
        assert standing.value_of_css_property("stroke") == "rgb(31, 111, 235)" and standing.size["width"] > 100
        taken = browser.find_elements(By.CSS_SELECTOR, "#diagram .edge.taken")
        assert [e.get_attribute("data-to") for e in taken] == ["do:charge_payment"]

        click(browser, 'a[href="/console/kinds/order"]')
        wait_until(lambda: browser.current_url.endswith("/console/kinds/order"), what="the saga kind's page")
        nodes = browser.find_elements(By.CSS_SELECTOR, "#diagram g.node")
        assert len(nodes) == 11 and browser.find_elements(By.CSS_SELECTOR, "#diagram .taken") == []
        # A step of the diagram leads to the sagas waiting there.
        click(browser, '#diagram g.node[data-node="do:charge_payment"] rect')
        wait_until(lambda: "step=charge_payment" in browser.current_url, what="the list of a step")
        assert saga_id in text(browser, "#saga-list")


@pytest.mark.heavy  # waits for the frame's 10-second redraw
def test_the_charts_draw_the_sagas_started_and_redraw_without_reloading_the_page(
    database_url: str, conn, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    def started() -> str:
        """The sagas started in the window, summed from the chart's points in the charts' frame.

        Read in one script, so that the frame's redraw cannot replace the points between finding them and
        reading them (element by element, a redraw in between left a stale reference: a failed CI run).
        """
        values = browser.execute_script(
            "const frame = document.getElementById('chart-frame').contentDocument;"
            "return Array.from(frame.querySelectorAll("
            "'#chart-sagas g[data-series=\"started\"] circle.point'), p => p.dataset.value);"
        )
        return str(sum(int(value) for value in values))

    with serving(database_url, tmp_path, "--no-access-log") as server:
        stuck_saga(server, conn)
        browser.get(f"{server.url}/console")
        click(browser, 'header a[href="/console/charts"]')
        wait_until(lambda: started() == "1", what="the chart of sagas started")
        browser.switch_to.frame(browser.find_element(By.ID, "chart-frame"))
        chart = browser.find_element(By.CSS_SELECTOR, "svg#chart-sagas")
        assert chart.size["width"] > 600 and chart.size["height"] > 150  # laid out and drawn
        assert len(browser.find_elements(By.CSS_SELECTOR, "svg.chart")) == 4
        browser.switch_to.default_content()
        # A mark on the page itself: it survives the frame's redraw, not a reload of the page.
        browser.execute_script("document.body.dataset.mark = 'still here'")
        stuck_saga(server, conn)
        wait_until(lambda: started() == "2", timeout=60, what="the frame redrawing the chart")
        assert browser.execute_script("return document.body.dataset.mark") == "still here"


def sagas_in_every_state(runtime: Any, conn: psycopg.Connection[Any]) -> dict[str, str]:
    """Real order sagas, one in each status, driven by the courier (a failed one is made so by hand); their ids."""
    from estafeta_actors.order_saga import ORDER_SAGA
    from estafeta_sql import sagas

    from ..shop import Courier, place, seed

    seed(runtime, {"rich": 100_000, "poor": 100}, {"s1": 50})
    courier = Courier(runtime, conn)
    made = {"completed": place(runtime, "rich", "s1", 1, 3_000)}
    courier.run()
    made["compensated"] = place(runtime, "poor", "s1", 1, 3_000)  # refused: not enough money
    courier.run()
    made["compensating"] = place(runtime, "poor", "s1", 1, 3_000)
    courier.run(hold=frozenset({"orders.cancel_order"}))  # its undo never answers
    made["running"] = place(runtime, "rich", "s1", 1, 3_000)  # nobody delivers its charge
    made["failed"] = place(runtime, "rich", "s1", 1, 3_000)
    conn.execute(
        "UPDATE orders.saga_order SET status = 'failed', last_error = 'payments: disk full' WHERE saga_id = %s",
        (made["failed"].saga_id,),
    )
    ids = {status: str(order.saga_id) for status, order in made.items()}
    for status, saga_id in ids.items():
        row = sagas.get(conn, ORDER_SAGA.table, uuid.UUID(saga_id))
        assert row is not None and row.status == status, (status, row)
    return ids


def local_times(browser: Any) -> list[tuple[str, str]]:
    """Each ``<time>`` of the page as (its datetime, its text), once the console's clock script redrew it."""
    wait_until(
        lambda: browser.execute_script(
            "return [...document.querySelectorAll('time[datetime]')].every(t => t.dataset.local === 'yes')"
        ),
        what="the times drawn in local time",
    )
    found = browser.find_elements("css selector", "time[datetime]")
    return [(t.get_attribute("datetime"), t.text) for t in found]


def aged(shown: str) -> bool:
    """Whether a time drawn by the console's script says its age (``3 minutes ago``, ``in 25 seconds``, ``now``)."""
    return re.search(r"( ago| now|· in \d+ \w+)$", shown) is not None


@pytest.mark.heavy  # one walk through every page: ~10 s
def test_every_page_on_sagas_in_every_state_from_a_count_to_the_path_taken(
    database_url: str, conn, runtime, browser: Any, tmp_path: Path
) -> None:
    from datetime import UTC, datetime, timedelta
    from zoneinfo import ZoneInfo

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from estafeta import Projector
    from estafeta_actors.app import app as order_system
    from estafeta_actors.order_events import STORE
    from estafeta_actors.order_history import OrderSummary
    from estafeta_actors.payments import ChargePayment

    ids = sagas_in_every_state(runtime, conn)
    projector = Projector(OrderSummary(), STORE)
    projector.create_tables(conn)
    projector.run_batch(conn)
    with runtime.database("orders").transaction() as tx:
        later = datetime.now(UTC) + timedelta(hours=3)
        scheduled = order_system.service("orders").send(tx, ChargePayment(uuid.uuid4(), "rich", 5), at=later)
    browser.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Tokyo"})

    def listed() -> str:
        return text(browser, "#saga-list")

    def submit() -> None:
        click(browser, "#filters button")

    with serving(database_url, tmp_path, "--no-access-log") as server:
        browser.get(f"{server.url}/console")
        # Times in the reader's zone (Tokyo here) with their age; statuses as coloured badges.
        for stamp, shown in local_times(browser):
            tokyo = datetime.fromisoformat(stamp).astimezone(ZoneInfo("Asia/Tokyo"))
            assert f"{tokyo:%M:%S}" in shown and aged(shown) and "UTC" not in shown, (stamp, shown)
        failed_badge = browser.find_element(By.CSS_SELECTOR, "#sagas th .badge.bad")
        assert failed_badge.value_of_css_property("background-color") == "rgba(253, 236, 236, 1)"

        # Each count leads to its list, which holds exactly that saga.
        for status, saga_id in ids.items():
            browser.get(f"{server.url}/console")
            click(browser, f'#sagas a[href="/console/sagas?kind=order&status={status}"]')
            wait_until(lambda s=status: f"status={s}" in browser.current_url, what=f"the list of {status} sagas")
            rows = browser.find_elements(By.CSS_SELECTOR, "#saga-list tr[id^=saga-]")
            assert [r.get_attribute("id") for r in rows] == [f"saga-{saga_id}"], status

        # Each filter of the form, applied in the browser.
        browser.get(f"{server.url}/console/sagas")
        assert all(saga_id in listed() for saga_id in ids.values())
        Select(browser.find_element(By.NAME, "kind")).select_by_visible_text("order")
        Select(browser.find_element(By.NAME, "status")).select_by_visible_text("compensating")
        submit()
        wait_until(lambda: "status=compensating" in browser.current_url, what="the list by status")
        assert ids["compensating"] in listed() and ids["compensated"] not in listed()
        browser.get(f"{server.url}/console/sagas")
        browser.find_element(By.NAME, "step").send_keys("charge_payment")
        submit()
        wait_until(lambda: "step=charge_payment" in browser.current_url, what="the list by step")
        assert ids["running"] in listed() and ids["completed"] not in listed()
        browser.get(f"{server.url}/console/sagas")
        browser.find_element(By.NAME, "error").send_keys("disk full")
        submit()
        wait_until(lambda: "error=disk" in browser.current_url, what="the list by error")
        assert ids["failed"] in listed() and ids["running"] not in listed()
        browser.get(f"{server.url}/console/sagas")
        soon = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
        browser.find_element(By.NAME, "since").send_keys(soon)
        submit()
        wait_until(lambda: "since=" in browser.current_url, what="the list by time")
        assert "no saga matches these filters" in listed()
        browser.get(f"{server.url}/console/sagas")
        browser.find_element(By.NAME, "until").send_keys(soon)
        submit()
        wait_until(lambda: "until=2" in browser.current_url, what="the list up to a time")
        assert all(saga_id in listed() for saga_id in ids.values())

        # From the list to the compensated saga: its compensations named, its path drawn.
        browser.get(f"{server.url}/console/sagas?status=compensated")
        click(browser, f"#saga-{ids['compensated']} a.id")
        wait_until(lambda: browser.current_url.endswith(ids["compensated"]), what="the compensated saga's page")
        assert text(browser, "#status") == "compensated"
        timeline = text(browser, "#timeline")
        assert "place_order compensated by CancelOrder" in timeline
        assert "notify_cancellation done after compensating (sent NotifyCustomer)" in timeline
        taken = [n.get_attribute("data-node") for n in browser.find_elements(By.CSS_SELECTOR, "#diagram g.node.taken")]
        assert {"do:place_order", "do:charge_payment", "undo:place_order", "after:notify_cancellation"} <= set(taken)
        assert "do:reserve_inventory" not in taken and "undo:charge_payment" not in taken
        end = browser.find_element(By.CSS_SELECTOR, 'g.node.current[data-node="end:compensated"] rect')
        assert end.value_of_css_property("stroke") == "rgb(31, 111, 235)"
        click(browser, 'a[href="/console/kinds/order"]')
        wait_until(lambda: browser.current_url.endswith("/console/kinds/order"), what="the kind's diagram")
        assert "sends CancelOrder" in text(browser, "#diagram")

        # The read models: projections, an event stream as of a version, the scheduled message.
        click(browser, 'header a[href="/console/projections"]')
        wait_until(lambda: "order_summary" in text(browser, "#projections"), what="the projections page")
        line = text(browser, "#projection-orders-order_summary")
        assert "stopped" in line  # no projector holds it
        lag = browser.find_element(By.CSS_SELECTOR, "#projection-orders-order_summary .lag-events").text
        assert lag.isdigit(), line
        click(browser, 'header a[href="/console/events"]')
        wait_until(lambda: "order-" in text(browser, "#recent-streams"), what="the streams written last")
        click(browser, "#recent-streams a.id")
        wait_until(lambda: "stream=" in browser.current_url, what="a stream's events")
        whole = browser.find_elements(By.CSS_SELECTOR, "#events tr[id^=event-]")
        assert len(whole) >= 1
        browser.find_element(By.NAME, "version").send_keys("1")
        click(browser, "#stream-form button")
        wait_until(lambda: "version=1" in browser.current_url, what="the stream at version 1")
        assert [r.get_attribute("id") for r in browser.find_elements(By.CSS_SELECTOR, "#events tr[id^=event-]")] == [
            "event-1"
        ]
        click(browser, 'header a[href="/console/outbox/scheduled"]')
        wait_until(lambda: str(scheduled) in text(browser, "#scheduled"), what="the scheduled message")
        assert "ChargePayment" in text(browser, f"#message-{scheduled}")
        click(browser, 'header a[href="/console/charts"]')
        wait_until(lambda: browser.find_elements(By.ID, "chart-frame") != [], what="the charts page")

        # The failure pages, reached from their counts: a failed outbox row, a dead-letter group.
        conn.execute("UPDATE orders.outbox SET status = 'failed', attempts = 5, last_error = 'connection refused'")
        conn.execute(
            "INSERT INTO payments.dead_letters (consumer, message_id, message, reason) VALUES (%s, %s, '{}', %s)",
            ("payments.charge_payment", str(uuid.uuid4()), "failed 4 times, last: OSError: disk full"),
        )
        browser.get(f"{server.url}/console")
        click(browser, '#outboxes a[href^="/console/outbox/failed"]')
        wait_until(lambda: "connection refused" in text(browser, "#failed-messages"), what="the failed rows")
        browser.get(f"{server.url}/console")
        click(browser, '#dead-letters a[href^="/console/dead-letters/"]')
        wait_until(lambda: "OSError: disk full" in text(browser, "#parked"), what="the dead-letter group")
        assert local_times(browser) != []
