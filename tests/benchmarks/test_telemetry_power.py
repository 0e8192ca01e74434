"""The telemetry power benchmark at tiny sizes: its JSON has the documented shape, a gross
fault FAILs through the production judging path, and a healthy revision PASSes without
a trip."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.telemetry_power import Outcome, censored_median, plan_for, rollout
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
        assert outcome == Outcome("PASS", outcome.minutes, (), outcome.judgements)
        assert outcome.minutes is not None and 5.0 <= outcome.minutes <= 12.0


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
