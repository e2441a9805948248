"""The console's saga diagrams: drawn from the declaration, a saga's path highlighted, every label escaped."""

from __future__ import annotations

import uuid
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs

from estafeta import NOTHING_TO_UNDO, Saga, SagaStep, Service
from estafeta_actors.order_saga import ORDER_SAGA
from estafeta_console import saga_diagram
from estafeta_sql.sagas import LogEntry, SagaRow

from .probe_sagas import LOAN, Loan

SVG = "{http://www.w3.org/2000/svg}"
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def parse(saga: Saga, where: saga_diagram.Position | None = None) -> ET.Element:
    return ET.fromstring(str(saga_diagram.render(saga, where)))


def nodes(svg: ET.Element, css: str = "") -> list[str]:
    return [
        g.get("data-node", "")
        for g in svg.iter(f"{SVG}g")
        if "node" in g.get("class", "").split() and css in [*g.get("class", "").split(), ""]
    ]


def edges(svg: ET.Element, css: str = "") -> set[tuple[str, str]]:
    found = set()
    for element in svg.iter():
        classes = element.get("class", "").split()
        if "edge" in classes and (not css or css in classes):
            found.add((element.get("data-from", ""), element.get("data-to", "")))
    return found


def row(saga: Saga, status: str, step: str, results: dict[str, Any], compensations: list[str] | None = None) -> SagaRow:
    return SagaRow(
        saga_id=uuid.uuid4(), key=uuid.uuid4(), status=status, current_step=step, payload={}, results=results,
        compensations=compensations, attempts=1, step_timeout=timedelta(seconds=30), deadline_at=None,
        started_at=NOW, updated_at=NOW, completed_at=None, last_error=None, version=1,
    )  # fmt: skip


def test_the_order_saga_is_drawn_with_its_steps_undos_and_point_of_no_return() -> None:
    svg = parse(ORDER_SAGA)
    steps = ["place_order", "charge_payment", "reserve_inventory", "confirm_order", "notify_customer"]
    assert nodes(svg, "step") + nodes(svg, "retriable") == [f"do:{s}" for s in steps[:3]] + [
        f"do:{s}" for s in steps[3:]
    ]
    assert nodes(svg, "retriable") == ["do:confirm_order", "do:notify_customer"]
    assert nodes(svg, "undo") == ["undo:place_order", "undo:charge_payment", "undo:reserve_inventory"]
    assert nodes(svg, "after") == ["after:notify_cancellation"]
    assert edges(svg, "next") == {
        ("do:place_order", "do:charge_payment"),
        ("do:charge_payment", "do:reserve_inventory"),
        ("do:reserve_inventory", "do:confirm_order"),
        ("do:confirm_order", "do:notify_customer"),
        ("do:notify_customer", "end:completed"),
    }
    # Undone right to left, then told, then compensated.
    assert edges(svg, "undo") | edges(svg, "after") == {
        ("undo:reserve_inventory", "undo:charge_payment"),
        ("undo:charge_payment", "undo:place_order"),
        ("undo:place_order", "after:notify_cancellation"),
        ("after:notify_cancellation", "end:compensated"),
    }
    assert svg.find(f".//{SVG}g[@class='node retriable']/{SVG}rect[@class='inner']") is not None  # a double border


def test_each_node_links_to_the_list_of_the_sagas_standing_on_it() -> None:
    links = {
        a.find(f"{SVG}g").get("data-node"): a.get("href")  # type: ignore[union-attr]
        for a in parse(ORDER_SAGA).iter(f"{SVG}a")
    }
    assert links["do:charge_payment"] == "/console/sagas?kind=order&step=charge_payment"
    assert links["undo:place_order"] == "/console/sagas?kind=order&step=place_order&status=compensating"
    assert links["end:compensated"] == "/console/sagas?kind=order&status=compensated"
    assert len(links) == 11


def test_a_branching_saga_draws_each_declared_branch_and_marks_an_undeclared_choice() -> None:
    svg = parse(LOAN)
    assert edges(svg, "branch") == {("do:approve", "do:disburse"), ("do:approve", "do:review")}
    assert ("do:review", "do:disburse") in edges(svg, "next")
    undeclared = Saga(
        "guess",
        service=Service("scratch"),
        data=Loan,
        key="loan_id",
        steps=[
            SagaStep("a", lambda s: 1, NOTHING_TO_UNDO, then=lambda s: "b"),
            SagaStep("b", lambda s: 1, NOTHING_TO_UNDO),
        ],
    )
    drawn = str(saga_diagram.render(undeclared))
    assert ("do:a", "?") in edges(ET.fromstring(drawn), "choice") and "chooses at run time" in drawn
    assert nodes(ET.fromstring(drawn), "undo") == []  # nothing to undo: no undo drawn


def test_a_saga_page_highlights_the_branch_it_took_and_where_it_stands() -> None:
    loan = Loan(uuid.uuid4(), 800)
    # Approved in full: disburse chosen, review skipped; waiting on the disbursal.
    waiting = row(LOAN, "running", "disburse", {"approve": {"approved": 800}})
    waiting = attrs.evolve(waiting, payload={"loan_id": str(loan.loan_id), "amount": 800})
    where = saga_diagram.position(LOAN, waiting, [])
    assert (where.path, where.current, where.failed) == (["do:approve", "do:disburse"], "do:disburse", False)
    svg = parse(LOAN, where)
    assert edges(svg, "taken") == {("do:approve", "do:disburse")}
    assert nodes(svg, "taken") == ["do:approve", "do:disburse"]
    assert nodes(svg, "current") == ["do:disburse"] and "do:review" not in nodes(svg, "taken")


def test_a_compensating_order_saga_shows_the_failed_step_and_the_undos_run_so_far() -> None:
    plan = ["charge_payment", "place_order", "notify_cancellation"]
    compensating = row(ORDER_SAGA, "compensating", "place_order", {"charge_payment": {}}, plan)
    timeline = [
        LogEntry(1, "running", "charge_payment", "started", None, NOW),
        LogEntry(2, "running", "reserve_inventory", "advanced", None, NOW),
        LogEntry(3, "compensating", "charge_payment", "compensating", "out of stock", NOW),
        LogEntry(4, "compensating", "place_order", "undone", None, NOW),
    ]
    where = saga_diagram.position(ORDER_SAGA, compensating, timeline)
    assert where.path == [
        "do:place_order", "do:charge_payment", "do:reserve_inventory", "undo:charge_payment", "undo:place_order"
    ]  # fmt: skip
    svg = parse(ORDER_SAGA, where)
    assert ("do:reserve_inventory", "undo:charge_payment") in edges(svg, "jump") & edges(svg, "taken")
    assert ("undo:charge_payment", "undo:place_order") in edges(svg, "taken")
    assert nodes(svg, "current") == ["undo:place_order"] and "undo:reserve_inventory" not in nodes(svg, "taken")
    failed = attrs.evolve(compensating, status="failed")
    assert nodes(parse(ORDER_SAGA, saga_diagram.position(ORDER_SAGA, failed, timeline)), "failed") == [
        "undo:place_order"
    ]
    done = attrs.evolve(compensating, status="compensated", current_step="notify_cancellation")
    assert nodes(parse(ORDER_SAGA, saga_diagram.position(ORDER_SAGA, done, timeline)), "current") == ["end:compensated"]


def test_every_label_is_escaped() -> None:
    hostile = '<script>alert("x")</script>&"'
    saga = Saga(
        "xss",
        service=Service("scratch"),
        data=Loan,
        key="loan_id",
        steps=[SagaStep(hostile, lambda s: 1, NOTHING_TO_UNDO), SagaStep("b", lambda s: 1, lambda s: 1)],
    )
    drawn = str(saga_diagram.render(saga))
    assert "<script>" not in drawn and "&lt;script&gt;" in drawn
    assert ET.fromstring(drawn) is not None  # still well-formed: attributes escaped too


def test_a_saga_whose_choice_raises_is_still_drawn_from_its_recorded_results() -> None:
    # A payload that no longer decodes (a deploy renamed a field): the path is what the results say.
    broken = row(LOAN, "running", "disburse", {"approve": {"approved": 800}})
    where = saga_diagram.position(LOAN, attrs.evolve(broken, payload={"renamed": 1}), [])
    assert where.path == ["do:approve", "do:disburse"] and where.current == "do:disburse"
