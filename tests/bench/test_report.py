"""bench.report's (b) verdict: each round's ratio to the same-work ceilings, median over rounds."""

from __future__ import annotations

from typing import Any

from bench import report, scenarios
from bench.scenarios import BARE_WORK, BARE_WORK_RUNNER, DIRECT, FUSED, Runner

RUNNERS = [
    Runner("direct", DIRECT),
    Runner(scenarios.BARE_FUSED, scenarios.BARE, plan=FUSED),
    Runner(BARE_WORK, scenarios.BARE, plan=FUSED, work=True),
    Runner(BARE_WORK_RUNNER, scenarios.BARE, plan=FUSED, work=True),
    Runner("gymflow", "gymflow", plan=FUSED),
]


def _report(rates: dict[str, list[float]]) -> dict[str, Any]:
    rows = {label: {"steps_per_s": max(all_), "steps_per_s_all": all_} for label, all_ in rates.items()}
    scenarios.add_same_plan_ratio(rows, RUNNERS, "steps_per_s")
    scenarios.add_paired_ratios(rows, RUNNERS)
    return {
        "runners": {r.label: r.kind for r in RUNNERS},
        "plans": {"gymflow": FUSED},
        "scenarios": {"b": {"runners": rows}},
    }


def test_one_fast_round_of_a_ceiling_does_not_decide() -> None:
    rates = {
        "direct": [7000.0, 7000.0, 7000.0],
        scenarios.BARE_FUSED: [400.0, 360.0, 380.0],
        BARE_WORK: [340.0, 330.0, 335.0],
        BARE_WORK_RUNNER: [430.0, 337.0, 344.0],  # the box's fastest moment fell on this round
        "gymflow": [354.0, 334.0, 338.0],
    }
    verdict = report.targets(_report(rates))["b"]
    row = _report(rates)["scenarios"]["b"]["runners"]["gymflow"]
    assert row["vs_bare_same_work_same_runner"] == round(354 / 430, 3)  # best rounds: 0.823
    assert row["vs_bare_same_work_same_runner_rounds"] == [0.823, 0.991, 0.983]
    assert row["vs_bare_same_work_same_runner_paired"] == 0.983
    assert verdict["met"] and "rounds [0.823, 0.991, 0.983]" in verdict["reached"]


def test_slower_in_most_rounds_is_not_met() -> None:
    rates = {
        "direct": [7000.0, 7000.0, 7000.0],
        scenarios.BARE_FUSED: [400.0, 360.0, 380.0],
        BARE_WORK: [340.0, 330.0, 335.0],
        BARE_WORK_RUNNER: [318.0, 336.0, 311.0],
        "gymflow": [283.0, 295.0, 287.0],  # the previous stop's calibrated run: 0.89x by this rule
    }
    verdict = report.targets(_report(rates))["b"]
    assert not verdict["met"]
    assert _report(rates)["scenarios"]["b"]["runners"]["gymflow"]["vs_bare_same_work_same_runner_paired"] == 0.89
