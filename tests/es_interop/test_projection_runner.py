"""The library's projection runner on the adapter: a subscription that never runs ahead of an open writer."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from tests.es_interop.support import drop_schema, require_eventsourcing

require_eventsourcing()

from eventsourcing.projection import EventSourcedProjectionRunner  # noqa: E402

from .bank import BankAccounts, DepositLedger  # noqa: E402


@pytest.fixture
def settings(database_url: str) -> Iterator[dict[str, str]]:
    """BankAccounts and DepositLedger, each in a schema of its own."""
    schemas = {"BANKACCOUNTS": f"es_{uuid.uuid4().hex[:12]}", "DEPOSITLEDGER": f"es_{uuid.uuid4().hex[:12]}"}
    yield {
        "PERSISTENCE_MODULE": "estafeta.eventsourcing",
        "ESTAFETA_DATABASE_URL": database_url,
        **{f"{name}_ESTAFETA_SCHEMA": schema for name, schema in schemas.items()},
    }
    for schema in schemas.values():
        drop_schema(database_url, schema)


def test_a_projection_follows_in_order_and_waits_for_an_open_writer(
    settings: dict[str, str], database_url: str
) -> None:
    with EventSourcedProjectionRunner(
        application_class=BankAccounts, projection_class=DepositLedger, env=settings
    ) as runner:
        accounts, ledger = runner.app, runner.projection
        first, second = accounts.open_account("ida"), accounts.open_account("jo")
        accounts.deposit(first, 10)
        runner.wait(accounts.recorder.max_notification_id(), timeout=15)
        assert ledger.deposited(first) == 10

        with psycopg.connect(database_url) as held:
            accounts.deposit(first, 1, conn=held)  # an earlier position, still open
            accounts.deposit(second, 2)  # a later one, committed
            time.sleep(1.5)  # the subscription is woken (NOTIFY) and polls every second
            # the later deposit waits behind the open one: applying it first would move the
            # projection's tracking past the open one's position, which would then be skipped
            assert ledger.deposited(second) == 0
        runner.wait(accounts.recorder.max_notification_id(), timeout=15)
        assert (ledger.deposited(first), ledger.deposited(second)) == (11, 2)
        assert ledger.recorder.max_tracking_id(accounts.name) == accounts.recorder.max_notification_id()
