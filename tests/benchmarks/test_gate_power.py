"""The gate power benchmark at tiny sizes: its JSON has the documented shape, and a
gross fault trips the production switch within a few evaluations."""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Iterator

import pytest
import structlog

from benchmarks import gate_power
from gates import GatesConfig, pin_reference
from gates.sequential import lorden_threshold

pytestmark = pytest.mark.slow

FAULTS = (
    "drift_30pct_one_category",
    "latency_x1.5",
    "errors_5pct",
    "corruption_3pct",
    "mismatch_80pct",
)


@pytest.fixture(autouse=True)
def _quiet_pair_logs() -> Iterator[None]:
    """The pair runner logs every pair at info; hundreds of them only slow the test."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    yield
    structlog.reset_defaults()


class TestGatePower:
    def test_tiny_run_has_the_documented_shape(self) -> None:
        """A run with a few hundred pairs per part reports every model, fault and figure,
        and serialises to JSON."""
        result = gate_power.run(
            quick=True,
            seed=0,
            healthy_pairs=1200,
            fault_seeds=1,
            cap=240,
            prefix_pairs=600,
            schedule_cap_hours=0.5,
            stress_budgets=(1e6, 10.0),
            pins_per_category=3,
            log=lambda _: None,
        )
        json.dumps(result)
        pins = result["drift_pins"]
        assert pins["pins"] == 3 * len(pins["by_category"]) and pins["pin_target_samples"] == 200
        assert 0 <= pins["pins_with_a_false_fail"] <= pins["pins"]
        assert pins["false_fail_per_category_30d_upper95"] > pins["false_fail_per_category_30d"]
        assert set(result["healthy"]) == {"realistic", "embedded_fit"}
        for row in result["healthy"].values():
            assert row["simulated_pairs"] == 1200
            assert row["evaluations"] >= 1
            assert row["trips"] >= 0
            assert row["trips_per_30_days_upper95"] > row["trips_per_30_days"]
            for key in ("trips_per_30_days", "trips_per_30_days_upper95"):
                assert isinstance(row[key], float)
        assert set(result["budget_stress"]) == {"realistic", "embedded_fit"}
        for rows in result["budget_stress"].values():
            assert set(rows) == {"1e+06", "10", "extrapolation", "wall_s"}
            for key in ("1e+06", "10"):
                row = rows[key]
                assert row["simulated_pairs"] == 1200
                assert row["evaluations"] >= 1
                assert row["trips"] == row["false_trips"] + row["trips_beyond_tolerance"]
                assert row["trips_per_30_days_upper95"] > row["trips_per_30_days"]
                assert row["within_budget"] == (row["trips_per_30_days"] <= float(key))
                assert row["observed_over_budget"] == pytest.approx(
                    row["trips_per_30_days"] / float(key)
                )
            for kind in ("false_trips", "all_trips"):
                assert rows["extrapolation"][kind]["to_budget"] == pytest.approx(0.1)
        # h ≈ 1.2 at a million false rollbacks per 30 days: the counter must see trips
        assert result["budget_stress"]["realistic"]["1e+06"]["trips"] > 0
        assert set(result["faults"]) == set(FAULTS)
        for row in result["faults"].values():
            for key in (
                "canaryd_pairs_median",
                "kayenta_pairs_median",
                "optimal_pairs",
                "optimal_within_tolerance_pairs",
                "tripped_by",
            ):
                assert key in row
            assert row["seeds"] == [0]
        for name in ("errors_5pct", "corruption_3pct", "mismatch_80pct"):
            assert result["faults"][name]["optimal_within_tolerance_statistic"] is not None
        assert (
            result["faults"]["drift_30pct_one_category"]["optimal_within_tolerance_pairs"] is None
        )
        assert result["faults"]["mismatch_80pct"]["tripped_by"] == "quality"
        assert "hours_to_all_pass" in result["default_schedule"]
        config = result["config"]
        assert config["budget"]["false_rollbacks_per_30_days"] == pytest.approx(
            GatesConfig().budget.false_rollbacks_per_30_days
        )
        assert config["h"] == pytest.approx(lorden_threshold(config["detector_arl0"]))
        assert result["elapsed_s"] > 0

    def test_kayenta_windows_start_on_their_own_clock(self) -> None:
        """The judge cannot know when a fault starts: the onset falls anywhere in a window,
        and a window that straddles it holds the healthy pairs before it."""
        phases = {gate_power.kayenta_phase(seed, 200) for seed in range(20)}
        assert all(0 <= p < 200 for p in phases) and len(phases) > 10
        model = gate_power.realistic()
        prefix = gate_power.PairStream(model, 0).take(300)
        fault = gate_power.Fault("mismatch_80pct", "mismatch", {"corrupt_rate": 0.8})
        stream = gate_power.FaultStream(
            gate_power.PairStream(model.with_speculative(corrupt_rate=0.8), 1, first=300), 200
        )
        aligned = gate_power.kayenta_pairs(fault, prefix, stream, [], 50, 0.01, 0)
        shifted = gate_power.kayenta_pairs(fault, prefix, stream, [], 50, 0.01, 30)
        assert aligned == 50
        assert shifted == 20  # the straddling window (30 healthy + 20 faulty pairs) rejects

    def test_mismatch_80pct_trips_within_twenty_pairs(self) -> None:
        """An 80 % greedy mismatch rate trips the switch through the quality gate at the
        60 s cadence (6 pairs) within 20 pairs in the median of five seeds, and within 30
        pairs on every seed."""
        config = GatesConfig()
        model = gate_power.realistic()
        trips = []
        for seed in range(5):
            prefix = gate_power.PairStream(model, seed).take(300)
            references = pin_reference(prefix, min_samples=config.drift.pin_min_samples)
            fault = gate_power.PairStream(
                model.with_speculative(corrupt_rate=0.8), seed + 7919, first=len(prefix)
            )
            pairs, gate, _ = gate_power.canaryd_pairs_to_trip(
                prefix, gate_power.FaultStream(fault, 60), config, references, screen=6
            )
            assert gate == "quality"
            assert pairs is not None and pairs <= 30
            trips.append(pairs)
        assert statistics.median(trips) <= 20
