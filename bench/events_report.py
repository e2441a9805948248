"""The printed table of ``bench.events``: each figure beside its baseline from the same run and its target."""

from __future__ import annotations

from typing import Any

from .common import describe


def _line(label: str, figure: str, note: str = "", verdict: str = "") -> str:
    return f"  {label:<44}{figure:>14}  {note:<46}{verdict}".rstrip()


def _ok(passed: bool) -> str:
    return "ok" if passed else "MISSED"


def _appends(found: dict[str, float], targets: dict[str, float]) -> list[str]:
    lines = []
    for batch, title in ((1, "one event per transaction"), (50, "batches of 50")):
        lines.append(f"Append, {title}, writer processes{'events/s':>21}")
        one = found[f"estafeta/{batch}/1"]
        for writers in (1, 4, 8):
            ours, theirs = found[f"estafeta/{batch}/{writers}"], found[f"eventsourcing/{batch}/{writers}"]
            note, verdict = f"{ours / theirs:.2f} x eventsourcing", ""
            if batch == 1 and writers == 4:
                verdict = _ok(ours / theirs >= targets["append_4_vs_eventsourcing"])
            if batch == 1 and writers == 8:
                note += f", {ours / one:.2f} x one writer"
                verdict = _ok(ours / one >= targets["append_8_vs_1"])
            if batch == 50 and writers == 8:
                best = max(found[f"estafeta/50/{w}"] for w in (1, 4, 8))
                verdict = _ok(best >= targets["batched_append"])
            lines.append(
                _line(f"estafeta, {writers} writer{'s' if writers > 1 else ''}", f"{ours:,.0f}", note, verdict)
            )
        for writers in (1, 4, 8):
            lines.append(
                _line(f"eventsourcing recorder, {writers}", f"{found[f'eventsourcing/{batch}/{writers}']:,.0f}")
            )
    return lines


def report(found: dict[str, Any], machine: dict[str, Any], targets: dict[str, float]) -> str:
    """The whole table as text."""
    catch, proj, agg, lag = found["catch_up"], found["projection"], found["aggregate"], found["lag"]
    lines = [
        f"estafeta event store benchmark; {describe(machine)}; {found['postgres']}",
        *_appends(found["append"], targets),
    ]
    lines.append(f"Catch-up read of the log{'events/s':>42}")
    lines.append(
        _line(
            "estafeta, gap-safe batches, decoded",
            f"{catch['decoded']:,.0f}",
            f"{catch['decoded'] / catch['eventsourcing']:.2f} x eventsourcing",
            _ok(catch["decoded"] >= targets["catch_up"]),
        )
    )
    lines.append(_line("estafeta, gap-safe batches, rows only", f"{catch['raw']:,.0f}"))
    lines.append(_line("eventsourcing select_notifications (bytes)", f"{catch['eventsourcing']:,.0f}"))
    lines.append(f"Projection, a checkpoint per batch of 1000{'events/s':>24}")
    lines.append(
        _line(
            "one statement per batch",
            f"{proj['cart_lines_batch']:,.0f}",
            "",
            _ok(proj["cart_lines_batch"] >= targets["projection"]),
        )
    )
    lines.append(_line("one statement per event (pipelined)", f"{proj['cart_lines']:,.0f}"))
    lines.append(f"Load of a 10,000-event aggregate{'p50 ms':>32}")
    snapshots_ok = _ok(agg["snapshots"] <= targets["snapshot_load_ms"])
    lines.append(
        _line(
            "estafeta, snapshots every 100",
            f"{agg['snapshots']:.2f}",
            f"eventsourcing: {agg['es_snapshots']:.2f}",
            snapshots_ok,
        )
    )
    lines.append(
        _line("estafeta, replaying every event", f"{agg['replay']:.1f}", f"eventsourcing: {agg['es_replay']:.1f}")
    )
    lines.append(f"Commit-to-projection lag{'p50 / p99 / max ms':>40}")
    lines.append(
        _line(
            f"at a steady 500 events/s ({lag['events']:.0f} events)",
            f"{lag['p50']:.1f} / {lag['p99']:.1f} / {lag['max']:.0f}",
            f"longest other writer on the server: {lag['other_writer_max_s']:.2f}s",
            _ok(lag["p99"] <= targets["lag_p99_ms"]),
        )
    )
    return "\n".join(lines)
