"""Dead-letter replay: one malformed letter in a replayed group is reported and left parked; the rest take effect.

A live workload: ``estafeta serve --allow-actions`` replays the group from its console,
a relay and a worker on RabbitMQ carry the replays to their step.
"""

from __future__ import annotations

import re
import urllib.parse
import uuid
from pathlib import Path

import pytest

from estafeta import Runtime, deliver
from estafeta.operations.dead_letters import groups
from tests.app import STEPS

from ..helpers import message_for, scalar, wait_until
from ..http_server import serving
from ..integration import processes
from ..lock_steps import open_account
from ..steps import Settle

pytestmark = pytest.mark.integration

SETTLE = "probe.test_settle"
PASSWORD = "blast radius"
LETTERS = 20


def park_settles(runtime: Runtime, count: int) -> list[uuid.UUID]:
    """``count`` settle commands failing on their last attempt (no account yet): parked with one cause."""
    orders = [uuid.uuid4() for _ in range(count)]
    for order_id in orders:
        message = message_for(SETTLE, Settle(order_id), retries=runtime.settings.max_retries)
        assert deliver(STEPS[SETTLE], runtime, message) == "dead_lettered"
    return orders


@pytest.mark.heavy
def test_a_malformed_dead_letter_in_a_replayed_group_stays_parked_with_its_reason_and_the_others_take_effect(
    database_url: str, amqp_url: str, runtime: Runtime, conn, tmp_path: Path
) -> None:
    orders = park_settles(runtime, LETTERS)
    ids = [int(i) for (i,) in conn.execute("SELECT id FROM probe.dead_letters ORDER BY id").fetchall()]
    poisoned = ids[LETTERS // 2]
    # A letter written by an older (or buggy) version: its reply context names a saga, without its id.
    conn.execute(
        """UPDATE probe.dead_letters
           SET message = jsonb_set(message, '{options,reply_to}', '{"context": {"saga": "order"}}')
           WHERE id = %s""",
        (poisoned,),
    )
    for order_id in orders:
        open_account(conn, order_id, 1_000)  # the cause, fixed
    (group,) = groups(runtime, ["probe"])
    assert group.count == LETTERS

    env = processes.service_env(database_url, amqp_url, ESTAFETA_APP="tests.app")
    operator = {"ESTAFETA_CONSOLE_PASSWORD": PASSWORD}
    with (
        serving(database_url, tmp_path, "--allow-actions", "--no-access-log", app="tests.app", env=operator) as server,
        processes.running(processes.workers(env, tmp_path, module="tests.worker"), processes.relay(env, tmp_path)),
        server.client(auth=("operator", PASSWORD)) as http,
    ):
        # The group's replay goes through its dry run: the page's form confirms it with the count.
        preview = http.get(f"/console/dead-letters/probe/{group.group}/replay").text
        form = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', preview))
        assert form.get("token") and form.get("count") == str(LETTERS), preview
        answer = http.post("/console/dead-letters/replay", data=form)
        assert answer.status_code == 303, answer.text  # not a 500 halfway through the group
        notice = urllib.parse.parse_qs(urllib.parse.urlsplit(answer.headers["Location"]).query)["notice"][0]
        assert notice.startswith(f"dead letters: {LETTERS - 1} replayed, 1 skipped; #{poisoned}: malformed:")
        charged = "SELECT count(*) FROM probe.test_charges WHERE charged"
        wait_until(lambda: scalar(conn, charged) == LETTERS - 1, timeout=60, what="every healthy replay's effect")
        # The poisoned letter is still there for the operator, with its reason.
        again = processes.estafeta(env, "dead-letters", "replay", str(poisoned))
        overview = http.get("/console").text
    assert again.returncode == 1
    assert f"probe #{poisoned} {SETTLE}: skipped: malformed: its reply context names a order saga" in again.stdout
    assert scalar(conn, "SELECT status FROM probe.dead_letters WHERE id = %s", poisoned) == "parked"
    assert scalar(conn, "SELECT count(*) FROM probe.dead_letters WHERE status = 'replayed'") == LETTERS - 1
    assert group.group in overview  # its group, down to the one letter, still on the console
