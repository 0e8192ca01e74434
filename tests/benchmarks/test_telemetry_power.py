"""The telemetry power benchmark at tiny sizes: its JSON has the documented shape (the
figures labelled measured or a floor of arithmetic), a gross fault FAILs through the
production judging path, a healthy revision PASSes without a trip, and the blind spots
decide: a correlated outage fault and a 4xx excess FAIL, a canary gone dark after PASS
reads NODATA within five minutes."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.telemetry_power import (
    Outcome,
    censored_median,
    config_for,
    pair_floor,
    plan_for,
    rollout,
)
from gates import GatesConfig

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


class TestFigures:
    def test_censored_median_counts_undecided_runs_as_longest(self) -> None:
        """An undecided run (None) is longer than any; a median that falls on one is None."""
        assert censored_median([3.0, None, 1.0]) == 3.0
        assert censored_median([None, None, 1.0]) is None
        assert censored_median([2.0, 4.0]) == 3.0
        assert censored_median([]) is None

    def test_the_plan_fits_the_acceptance_lengths(self) -> None:
        """Healthy acceptance length about 2.5 with 3 draft tokens; the fault 30 % lower."""
        lengths = plan_for(5).acceptance_lengths
        assert lengths["healthy"] == pytest.approx(2.5, abs=0.05)
        assert lengths["acceptance_drop_30pct"] == pytest.approx(0.7 * lengths["healthy"], 0.03)


class TestRollouts:
    def test_a_gross_error_fault_fails_within_minutes(self) -> None:
        """The speculative arm failing half its requests: telemetry.errors FAILs the
        verdict within two minutes at 5 requests per second."""
        plan = plan_for(5)
        arms = plan.faults["errors_5pct"]
        gross = replace(arms, speculative_error_rate=0.5)
        outcome = rollout(
            gross, plan.healthy, 0, cap_minutes=5, pairs_per_minute=20, config=GatesConfig()
        )
        assert outcome.verdict == "FAIL"
        assert "telemetry.errors" in outcome.failed_by
        assert outcome.minutes is not None and outcome.minutes <= 2.0

    def test_a_healthy_revision_passes_without_a_trip(self) -> None:
        """Healthy pairs and telemetry: PASS (the greedy mismatch bound, at 40 pairs a
        minute, decides it), never FAIL."""
        plan = plan_for(5)
        outcome = rollout(
            plan.healthy, plan.healthy, 1, cap_minutes=15, pairs_per_minute=40, config=GatesConfig()
        )
        assert outcome == Outcome(
            "PASS", outcome.minutes, (), outcome.judgements, outcome.telemetry_pass_minutes
        )
        assert outcome.minutes is not None and 5.0 <= outcome.minutes <= 12.0
        # the telemetry's own PASS comes first; the verdict waits on the pairs
        assert outcome.telemetry_pass_minutes is not None
        assert outcome.telemetry_pass_minutes <= outcome.minutes

    def test_the_pair_floor_is_arithmetic(self) -> None:
        """322 exact pairs bound the greedy mismatch rate within 0.005 at 0.8: 10.73
        minutes at 30 a minute, the 15 s judgement at 10.75."""
        pairs, minutes, judged = pair_floor(GatesConfig(), 30.0)
        assert pairs == 322
        assert minutes == pytest.approx(322 / 30)
        assert judged == 10.75

    def test_a_correlated_outage_fault_fails(self) -> None:
        """Outages in 5 % of intervals, the speculative arm failing 80–100 % in them:
        telemetry.errors FAILs with the outage screen on, as with it off."""
        plan = plan_for(5)
        arms = plan.faults["correlated_outage_fault"]
        for scenario in ("correlated_outage_fault", "correlated_outage_fault_screen_off"):
            outcome = rollout(
                arms, plan.healthy, 5, cap_minutes=15, pairs_per_minute=30,
                config=config_for(scenario),
            )  # fmt: skip
            assert outcome.verdict == "FAIL", scenario
            assert "telemetry.errors" in outcome.failed_by

    def test_a_4xx_excess_fails(self) -> None:
        """The speculative arm answering 30 % of requests 4xx, the baseline 2 %: FAIL
        within a minute."""
        plan = plan_for(5)
        outcome = rollout(
            plan.faults["errors_4xx_30pct"], plan.healthy, 5, cap_minutes=5,
            pairs_per_minute=30, config=GatesConfig(),
        )  # fmt: skip
        assert outcome.verdict == "FAIL" and "telemetry.errors" in outcome.failed_by
        assert outcome.minutes is not None and outcome.minutes <= 1.0

    @pytest.mark.parametrize("dark", ["no_requests", "scrapes_fail"])
    def test_a_canary_gone_dark_after_pass_is_nodata_within_five_minutes(self, dark: str) -> None:
        """After the verdict PASSes the speculative arm goes dark: every telemetry gate
        reads NODATA within five minutes, and the verdict is no longer PASS."""
        plan = plan_for(5)
        outcome = rollout(
            plan.faults["canary_goes_dark"], plan.healthy, 5, cap_minutes=15,
            pairs_per_minute=40, config=GatesConfig(), dark=dark,
        )  # fmt: skip
        assert outcome.verdict == "NODATA" and outcome.dark_mode == dark
        assert outcome.minutes is not None and outcome.minutes <= 5.0
        assert outcome.verdict_after != "PASS"


class TestReport:
    def test_the_json_has_the_documented_shape(self, tmp_path: Path) -> None:
        """Run as a user does (a file path, --out): rates keyed by the request rate as a
        string, each with healthy trips and minutes to PASS and each fault's minutes to
        FAIL; the false-trip rate and the budget at the top."""
        out = tmp_path / "telemetry_power.json"
        completed = subprocess.run(
            [
                sys.executable,
                str(REPO / "benchmarks" / "telemetry_power.py"),
                "--seeds",
                "1",
                "--cap-minutes",
                "4",
                "--soak-hours",
                "1",
                "--jobs",
                "1",
                "--rates",
                "50",
                "--faults",
                "errors_5pct",
                "--blind-spots",
                "--out",
                str(out),
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert completed.returncode == 0, completed.stderr
        report = json.loads(out.read_text(encoding="utf-8"))
        assert set(report["rates"]) == {"50"}
        figures = report["rates"]["50"]
        assert figures["healthy"]["trips"] == 0
        assert set(figures["healthy"]) >= {"trips", "minutes_to_pass"}
        assert figures["faults"]["errors_5pct"]["minutes_to_fail"] is not None
        assert figures["faults"]["errors_5pct"]["failed_by"] == ["telemetry.errors"]
        assert report["healthy_false_trips_per_30d"] == 0.0
        assert report["healthy_false_trips_per_30d_upper95"] > 0
        assert report["budget"]["detectors"] == 16 + 8
        stress = report["budget_stress"]
        assert stress["soak_hours"] == 1.0 and stress["within_share"] is True
        assert "rps" in completed.stdout
        assert report["pair_floor"]["exact_pairs"] == 322
        assert "floor of arithmetic" in report["figures"]["healthy.minutes_to_pass"]
        assert report["figures"]["healthy.telemetry_minutes_to_pass"].startswith("measured")
        assert "telemetry_minutes_to_pass" in figures["healthy"]
        assert "blind_spots" not in figures  # none asked for, and not at 5 requests/s
