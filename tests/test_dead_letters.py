"""Dead letters an operator can act on: grouped by cause, shown, replayed once through the outbox."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from estafeta import Clock, Runtime, Settings, Watchdog, deliver
from estafeta.operations.dead_letter_causes import normalise
from estafeta.operations.dead_letter_replay import replay
from estafeta.operations.dead_letters import groups, list_dead_letters, show
from estafeta.testing import VirtualClock
from estafeta_actors.order_saga import ORDER_SAGA
from estafeta_brokers.publish import to_message
from tests.app import STEPS
from tests.app import app as tests_app

from .helpers import message_for, scalar, wait_until
from .lock_steps import open_account
from .services import scratch_database
from .shop import Courier, place, saga, seed
from .steps import Settle
from .test_saga import CHARGE, CONFIRM, TIMEOUT, _give_up_on_charge, order_status, overdue
from .test_saga_refusals import lock_held_elsewhere

SETTLE = "probe.test_settle"


def parked_settle(runtime: Runtime, order_id: uuid.UUID) -> Any:
    """A settle command failing on its last allowed attempt: dead-lettered with the error."""
    message = message_for(SETTLE, Settle(order_id), retries=runtime.settings.max_retries)
    assert deliver(STEPS[SETTLE], runtime, message) == "dead_lettered"
    return message


def charges(conn, order_id: uuid.UUID) -> int:
    return int(scalar(conn, "SELECT count(*) FROM probe.test_charges WHERE order_id = %s AND charged", order_id))


def test_dead_letters_are_grouped_by_actor_error_type_and_normalised_message(runtime: Runtime, conn) -> None:
    for _ in range(3):
        parked_settle(runtime, uuid.uuid4())
    bad = message_for(SETTLE, Settle(uuid.uuid4())).copy(args=({"order_id": "nope"},))
    assert deliver(STEPS[SETTLE], runtime, bad) == "dead_lettered"
    found = groups(runtime, ["probe"])
    assert [(g.cause.actor, g.cause.error, g.count) for g in found] == [
        (SETTLE, "LookupError", 3),
        (SETTLE, "InvalidMessage", 1),
    ]
    assert found[0].cause.pattern == "no account for order <uuid>"
    assert len({g.group for g in found}) == 2
    letters = list_dead_letters(runtime, ["probe"], group=found[0].group)
    assert len(letters) == 3 and all(letter.cause == found[0].cause for letter in letters)
    assert show(runtime, ["probe"], letters[0].id).message["args"] == letters[0].message["args"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("order 1f0e0c4e-8b1a-4c53-9a55-2b8e3c1d0e77 needs 3000 cents", "order <uuid> needs <n> cents"),
        ("customer 'ann' has no account", "customer <str> has no account"),
        ('key "k-42"  is    taken', "key <str> is taken"),
    ],
)
def test_messages_are_normalised_so_one_cause_is_one_group(text: str, expected: str) -> None:
    assert normalise(text) == expected


def test_a_replay_goes_through_the_outbox_under_a_new_id_and_takes_effect_once(runtime: Runtime, conn) -> None:
    order_id = uuid.uuid4()
    original = parked_settle(runtime, order_id)
    (group,) = groups(runtime, ["probe"])
    assert deliver(STEPS[SETTLE], runtime, original) == "duplicate"  # the inbox swallows a plain re-send
    open_account(conn, order_id)  # the cause, fixed
    assert [o.outcome for o in replay(runtime, tests_app, ["probe"], group=group.group, dry_run=True)] == [
        "would replay"
    ]
    assert scalar(conn, "SELECT count(*) FROM probe.outbox") == 0
    (outcome,) = replay(runtime, tests_app, ["probe"], group=group.group)
    assert outcome.outcome == "replayed" and outcome.message_id is not None
    row = conn.execute("SELECT message_id, actor_name, message FROM probe.outbox").fetchone()
    assert row[0] == outcome.message_id and row[0] != uuid.UUID(original.message_id)
    assert row[1] == SETTLE and row[2]["args"] == list(original.args)
    assert row[2]["options"]["replay_of"] == original.message_id
    assert "retries" not in row[2]["options"]  # a fresh set of retries
    letter = show(runtime, ["probe"], outcome.letter.id)
    assert (letter.status, letter.replayed_as) == ("replayed", outcome.message_id)
    # Replaying again (the group, or the one id) changes nothing: one effect.
    assert replay(runtime, tests_app, ["probe"], group=group.group) == []
    assert [o.outcome for o in replay(runtime, tests_app, ["probe"], ids=[letter.id])] == ["already replayed"]
    Courier(runtime, conn).run()
    assert charges(conn, order_id) == 1
    assert scalar(conn, "SELECT count(*) FROM probe.outbox") == 0


def _charge_parked_while_locked(runtime: Runtime, conn, database_url: str) -> tuple[uuid.UUID, uuid.UUID]:
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000, step_timeout=30)
    row = Courier(runtime, conn).take(CHARGE)
    message = to_message(row).copy(options={"retries": runtime.settings.max_retries})
    with lock_held_elsewhere(database_url, str(placed.order_id)):
        assert deliver(STEPS[CHARGE], runtime, message) == "dead_lettered"  # its last attempt met the lock
    assert "LockNotAcquired" in scalar(conn, "SELECT reason FROM payments.dead_letters")
    return placed.saga_id, placed.order_id


def test_a_saga_command_whose_saga_still_waits_for_it_is_replayed(runtime: Runtime, conn, database_url) -> None:
    saga_id, _ = _charge_parked_while_locked(runtime, conn, database_url)
    assert [o.outcome for o in replay(runtime, tests_app, ["payments"])] == ["replayed"]
    Courier(runtime, conn).run()
    assert saga(conn, saga_id).status == "completed"  # the replay's answer was the one the saga waited for
    assert scalar(conn, "SELECT balance_cents FROM payments.accounts") == 7_000


def test_a_saga_command_whose_saga_moved_on_is_marked_obsolete_not_replayed(
    runtime: Runtime, conn, database_url
) -> None:
    saga_id, _ = _charge_parked_while_locked(runtime, conn, database_url)
    courier = Courier(runtime, conn)
    # Every re-send goes unanswered too: the saga gives up on the charge and compensates.
    clock = VirtualClock(Clock(runtime, tests_app.service_names), watchdog=Watchdog(runtime, [ORDER_SAGA]))
    _give_up_on_charge(conn, courier, clock, saga_id)
    courier.run()
    assert saga(conn, saga_id).status == "compensated"
    (outcome,) = replay(runtime, tests_app, ["payments"])
    assert outcome.outcome == "obsolete" and "moved on" in (outcome.detail or "")
    assert scalar(conn, "SELECT count(*) FROM payments.outbox") == 0
    assert show(runtime, ["payments"], outcome.letter.id).status == "obsolete"
    assert scalar(conn, "SELECT balance_cents FROM payments.accounts") == 10_000


def test_the_command_a_failed_saga_gave_up_on_is_replayed_and_its_answer_completes_the_saga(
    runtime: Runtime, conn, database_url
) -> None:
    # The watchdog gave the saga up for want of an answer to its confirm (past the point of no
    # return); the confirm itself was parked by its step. The saga takes a late answer to that
    # very command, so the replay is not obsolete: it completes the saga.
    seed(runtime, {"c1": 10_000}, {"s1": 5})
    placed = place(runtime, "c1", "s1", 2, 3_000, step_timeout=TIMEOUT)
    courier = Courier(runtime, conn)
    clock = VirtualClock(Clock(runtime, tests_app.service_names), watchdog=Watchdog(runtime, [ORDER_SAGA]))
    courier.run(hold=frozenset({CONFIRM}))
    held = courier.take(CONFIRM)
    for attempt in range(1, 4):
        overdue(clock, attempt)
        while courier.pending(CONFIRM):
            courier.take(CONFIRM)  # lost
    assert saga(conn, placed.saga_id).status == "gave_up"
    message = to_message(held).copy(options={"retries": runtime.settings.max_retries})
    with lock_held_elsewhere(database_url, str(placed.order_id)):
        assert deliver(STEPS[CONFIRM], runtime, message) == "dead_lettered"  # its last attempt met the lock
    (outcome,) = replay(runtime, tests_app, ["orders"])
    assert outcome.outcome == "replayed", outcome.detail
    courier.run()
    assert saga(conn, placed.saga_id).status == "completed"
    assert order_status(conn, placed.order_id) == "confirmed"


def park(conn, consumer: str, options: Any, args: Any = None) -> int:
    """A dead letter of ``consumer`` written as a step parks one (failing on a full disk); its id."""
    if args is None:
        args = [{"order_id": str(uuid.uuid4()), "customer_id": "c1", "amount_cents": 100}]
    message = {"args": args, "options": options}
    reason = "failed 4 times, last: OSError: disk full"
    return int(
        scalar(
            conn,
            "INSERT INTO payments.dead_letters (consumer, message_id, message, reason)"
            " VALUES (%s, %s, %s, %s) RETURNING id",
            consumer,
            str(uuid.uuid4()),
            Jsonb(message),
            reason,
        )
    )


def test_a_malformed_letter_is_reported_and_skipped_and_the_rest_of_its_group_is_replayed(
    runtime: Runtime, conn
) -> None:
    healthy = [park(conn, CHARGE, {}) for _ in range(3)]
    no_saga_id = park(conn, CHARGE, {"reply_to": {"context": {"saga": "order", "step": "charge_payment"}}})
    not_an_object = park(conn, CHARGE, {"reply_to": ["order"]})
    unsendable = park(conn, CHARGE, {}, args=7)  # fails only when written to the outbox
    (group,) = groups(runtime, ["payments"])
    assert group.count == 6  # one cause: replaying the group meets the malformed ones among the others
    done = {o.letter.id: o for o in replay(runtime, tests_app, ["payments"], group=group.group)}
    assert [str(done[i].outcome) for i in healthy] == ["replayed"] * 3
    assert done[no_saga_id].outcome == "skipped"
    assert "names a order saga but its saga_id None is not a saga id" in (done[no_saga_id].detail or "")
    assert done[not_an_object].outcome == "skipped"
    assert "options.reply_to is not a JSON object" in (done[not_an_object].detail or "")
    assert done[unsendable].outcome == "failed" and "TypeError" in (done[unsendable].detail or "")
    assert scalar(conn, "SELECT count(*) FROM payments.outbox") == 3
    statuses = dict(conn.execute("SELECT id, status FROM payments.dead_letters").fetchall())
    assert statuses[no_saga_id] == statuses[not_an_object] == statuses[unsendable] == "parked"  # for the operator


def test_the_cli_reports_a_malformed_letter_in_one_line_and_replays_the_others(database_url: str, conn) -> None:
    from .integration.processes import service_env
    from .test_cli import run

    healthy = park(conn, CHARGE, {})
    bad = park(conn, CHARGE, {"reply_to": {"context": {"saga": "order", "saga_id": "nope"}}})
    result = run(service_env(database_url, "stub://"), "dead-letters", "replay", "--all", "--service", "payments")
    assert result.returncode == 1, result.stderr  # something was left parked
    assert f"payments #{healthy} {CHARGE}: replayed as " in result.stdout
    assert f"payments #{bad} {CHARGE}: skipped: malformed: its reply context names a order saga" in result.stdout


def lock_waiter(conn, table: str) -> bool:
    """Whether some backend waits for a row lock in ``table``."""
    return bool(
        scalar(
            conn,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query LIKE %s",
            f"%{table}%FOR UPDATE%",
        )
    )


def replay_while_its_saga_moves_on(
    runtime: Runtime, saga_id: uuid.UUID, letters_url: str, sagas: psycopg.Connection[Any]
) -> tuple[bool, list[Any]]:
    """Replay the parked charge while another transaction moves its saga on; whether it moved first, the outcomes.

    The test holds the letter: the replay has looked at the saga and waits. Then the saga
    is resumed (a new version: the parked charge's answer would be stale). Deterministic:
    each side is seen waiting (or done) in ``pg_stat_activity`` before the next one goes.
    """
    outcomes: list[Any] = []
    replaying = threading.Thread(target=lambda: outcomes.extend(replay(runtime, tests_app, ["payments"])))

    def resume() -> None:
        with runtime.database("orders").transaction() as tx:
            ORDER_SAGA.resume(tx, saga_id)

    moving_on = threading.Thread(target=resume)
    with psycopg.connect(letters_url) as holder, psycopg.connect(letters_url, autocommit=True) as letters:
        holder.execute("SELECT 1 FROM payments.dead_letters FOR UPDATE")
        replaying.start()
        wait_until(lambda: lock_waiter(letters, "dead_letters"), what="the replay waiting for the letter")
        moving_on.start()
        wait_until(
            lambda: not moving_on.is_alive() or lock_waiter(sagas, "saga_order"),
            what="the saga's transition, done or waiting for its lock",
        )
        moved_first = not moving_on.is_alive()
        holder.rollback()
    replaying.join(timeout=20)
    moving_on.join(timeout=20)
    return moved_first, outcomes


def test_a_saga_cannot_move_on_between_the_obsolescence_decision_and_the_replay(
    runtime: Runtime, conn, database_url
) -> None:
    saga_id, _ = _charge_parked_while_locked(runtime, conn, database_url)
    moved_first, outcomes = replay_while_its_saga_moves_on(runtime, saga_id, database_url, conn)
    assert not moved_first, "the saga moved on while a replay that judged it still waiting was in progress"
    # The replay committed first, as a command the saga waited for; the saga moved on after it.
    assert [str(o.outcome) for o in outcomes] == ["replayed"]
    assert saga(conn, saga_id).version == 2


def test_the_saga_lock_holds_when_the_saga_lives_in_another_database(runtime: Runtime, conn, database_url) -> None:
    with scratch_database() as payments_url:
        split = Runtime(Settings(database_url=database_url, service_database_urls={"payments": payments_url}))
        try:
            split.migrate([s for s in tests_app.services if s.name == "payments"])
            placed = place(split, "c1", "s1", 1, 3_000)
            charge = to_message(Courier(split, conn).take(CHARGE))
            message = {"args": list(charge.args), "kwargs": charge.kwargs, "options": charge.options}
            with psycopg.connect(payments_url, autocommit=True) as payments:
                payments.execute(
                    "INSERT INTO payments.dead_letters (consumer, message_id, message, reason) VALUES (%s, %s, %s, %s)",
                    (CHARGE, charge.message_id, Jsonb(message), "failed 4 times, last: OSError: disk full"),
                )
            moved_first, outcomes = replay_while_its_saga_moves_on(split, placed.saga_id, payments_url, conn)
        finally:
            split.close()
    assert not moved_first and [str(o.outcome) for o in outcomes] == ["replayed"]
    assert saga(conn, placed.saga_id).version == 2


def test_show_names_a_dead_letter_that_is_not_there(runtime: Runtime) -> None:
    with pytest.raises(LookupError, match="no dead letter 42"):
        show(runtime, ["probe"], 42)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["dead-letters", "replay"], "give LETTER_IDS, --group GROUP or --all"),
        (["dead-letters", "replay", "1", "--all"], "give LETTER_IDS, --group GROUP or --all"),
        (["dead-letters", "replay", "--group", "0123456789"], "no parked dead letters in group 0123456789"),
        (["dead-letters", "show", "424242"], "no dead letter 424242"),
        (["dead-letters", "list", "--service", "nope"], "Invalid value for --service"),
    ],
)
def test_the_commands_refuse_bad_input_in_one_line(database_url: str, runtime: Runtime, args, expected) -> None:
    from .integration.processes import service_env
    from .test_cli import run

    result = run(service_env(database_url, "stub://"), *args)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1
