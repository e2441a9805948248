"""RabbitMQ stopped under a running relay (``rabbitmqctl stop_app`` on a private node), then started."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from ..helpers import scalar, wait_until
from ..relay_support import add, arrivals, check_order
from . import processes
from .relay_faults import private_rabbitmq, read_queue

pytestmark = [pytest.mark.integration, pytest.mark.heavy]


@pytest.fixture(scope="module")
def rabbitmq_node() -> Iterator[tuple[str, Callable[..., None]]]:
    with private_rabbitmq() as node:
        yield node


def test_rows_wait_out_a_rabbitmq_outage_and_go_out_after_it(rabbitmq_node, database_url, runtime, conn, tmp_path):
    url, rabbitmqctl = rabbitmq_node
    env = processes.service_env(database_url, url)
    relay = processes.relay(env, tmp_path)
    pending = "SELECT count(*) FROM pingpong.outbox"
    with processes.running(relay):
        for seq in range(10):
            add(conn, f"k{seq % 3}", seq)
        wait_until(lambda: scalar(conn, pending) == 0, timeout=30, what="the rows before the outage")
        rabbitmqctl("stop_app")
        try:
            for seq in range(10, 30):
                add(conn, f"k{seq % 3}", seq)
            wait_until(lambda: "relay paused" in relay.output(), timeout=30, what="the relay noticing the outage")
            # An outage is not the rows' fault: nothing counted against them, nothing failed.
            assert scalar(conn, "SELECT count(*) FROM pingpong.outbox WHERE attempts = 0 AND status = 'pending'") == 20
            assert relay.popen.poll() is None
        finally:
            rabbitmqctl("start_app")
        wait_until(lambda: scalar(conn, pending) == 0, timeout=90, what="the rows after the outage")
        relay.kill(15)  # SIGTERM: a relay that went through an outage still stops cleanly
        assert relay.popen.wait(15) == 0
    expected = {f"k{k}": list(range(k, 30, 3)) for k in range(3)}
    assert check_order(arrivals(read_queue(url, "relaycheck")), expected) == 0
