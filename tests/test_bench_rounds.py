"""``bench.sagas --rounds``: the round reported is the median one, beside every round's figures in the order run."""

from __future__ import annotations

from typing import Any

from bench.sagas import median_round, round_order


def _round(rate: float, cpu_ms: float) -> dict[str, Any]:
    return {"sagas": {"sagas_per_second": rate, "cpu_ms_per_step": cpu_ms}}


def _rate(r: dict[str, Any]) -> float:
    return float(r["sagas"]["sagas_per_second"])


def _cpu(r: dict[str, Any]) -> float:
    return float(r["sagas"]["cpu_ms_per_step"])


def test_the_median_round_is_reported_with_every_round_in_the_order_run() -> None:
    found = [_round(40.0, 5.0), _round(31.0, 6.5), _round(36.0, 5.5)]
    median = median_round(found, _rate, _cpu)
    assert median["sagas"] == {"sagas_per_second": 36.0, "cpu_ms_per_step": 5.5}
    assert median["rounds"] == [[40.0, 5.0], [31.0, 6.5], [36.0, 5.5]]
    assert "rounds" not in found[2]  # the rounds measured are left as they were


def test_of_an_even_number_of_rounds_the_lower_middle_is_reported_and_one_round_is_itself() -> None:
    assert median_round([_round(40.0, 5.0), _round(31.0, 6.5)], _rate, _cpu)["sagas"]["sagas_per_second"] == 31.0
    assert median_round([_round(40.0, 5.0)], _rate, _cpu)["rounds"] == [[40.0, 5.0]]


def test_every_other_round_measures_the_variants_backwards() -> None:
    variants = ["rabbitmq", "rabbitmq-ho", "dbos"]
    assert [round_order(variants, n) for n in range(3)] == [
        ["rabbitmq", "rabbitmq-ho", "dbos"],
        ["dbos", "rabbitmq-ho", "rabbitmq"],
        ["rabbitmq", "rabbitmq-ho", "dbos"],
    ]
    assert variants == ["rabbitmq", "rabbitmq-ho", "dbos"]  # left as it was
