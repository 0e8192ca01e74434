"""The gate power benchmark at tiny sizes: its JSON has the documented shape, and a
gross fault trips the production switch within a few evaluations."""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog
from scipy.stats import mannwhitneyu

from benchmarks import gate_power
from benchmarks.gate_power.faults import faults
from gates import GatesConfig, SwitchMode, pin_reference
from gates.pairs.liveness import liveness_gate
from gates.stats.budget import DEFAULT_ARL0
from gates.stats.sequential import lorden_threshold
from gates.window import concurrent_groups

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

FAULTS = (
    "drift_30pct_one_category",
    "latency_x1.5",
    "errors_5pct",
    "corruption_3pct",
    "mismatch_80pct",
    "greedy_verify_bf16",
    "correlated_fault",
    "dead_arm_flaky_baseline",
    "runner_up_bug",
    "calibrated_runner_up_bug",
)
HEALTHY = (
    "realistic",
    "embedded_fit",
    "deployment_bf16",
    "flaky_infra_10pct",
    "duplicated_pairs",
    "healthy_stalls",
)


@pytest.fixture(autouse=True)
def _quiet_pair_logs() -> Iterator[None]:
    """The pair runner logs every pair at info; hundreds of them only slow the test."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    yield
    structlog.reset_defaults()


def without_wall_times(value: Any) -> Any:
    """`value` with every `wall_s` and `elapsed_s` left out, at any depth."""
    if isinstance(value, dict):
        return {
            key: without_wall_times(item)
            for key, item in value.items()
            if key not in ("wall_s", "elapsed_s")
        }
    if isinstance(value, list):
        return [without_wall_times(item) for item in value]
    return value


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
            prefix_pairs=300,
            schedule_cap_hours=0.5,
            stress_budgets=(1e6, 10.0),
            pins_per_category=2,
            cadence_pairs=300,
            log=lambda _: None,
        )
        json.dumps(result)
        pins = result["drift_pins"]
        assert pins["pins"] == 2 * len(pins["by_category"]) and pins["pin_target_samples"] == 200
        assert 0 <= pins["pins_with_a_false_fail"] <= pins["pins"]
        assert pins["false_fail_per_category_30d_upper95"] > pins["false_fail_per_category_30d"]
        assert set(result["healthy"]) == set(HEALTHY)
        for row in result["healthy"].values():
            assert row["simulated_pairs"] == 1200
            assert row["evaluations"] >= 1
            assert row["trips"] >= 0
            assert row["trips_per_30_days_upper95"] > row["trips_per_30_days"]
            for key in ("trips_per_30_days", "trips_per_30_days_upper95"):
                assert isinstance(row[key], float)
            # the daemon's own cadence: every gate every 6 pairs over the first 300
            cadence = row["cadence"]
            assert cadence["simulated_pairs"] == 300 and cadence["evaluations"] == 50
            assert cadence["evaluate_every_pairs"] == 6
            assert cadence["trips"] == len(cadence["trip_log"]) == 0
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
        assert set(result["faults"]) == set(FAULTS)
        for row in result["faults"].values():
            for key in (
                "canaryd_pairs_median",
                "kayenta_pairs_median",
                "optimal_pairs",
                "optimal_within_tolerance_pairs",
                "tripped_by",
                # the names the documented bar reads
                "canaryd_pairs_ci95",
                "kayenta_tolerant_pairs_median",
                "oracle_at_tolerance_pairs",
                "canaryd_minutes_default_schedule",
            ):
                assert key in row
            assert row["seeds"] == [0]
            assert row["oracle_at_tolerance_pairs"] == row["optimal_within_tolerance_pairs"]
            single = row["canaryd_pairs"][0]
            assert row["canaryd_pairs_ci95"] == [single, single]
            if single is not None:  # at most every pair at 30 s, at least every pair at 10 s
                minutes = row["canaryd_minutes_default_schedule"]
                assert single * 10 / 60 - 0.1 <= minutes <= single * 30 / 60 + 0.1
        # h ≈ 1.2 at a million false rollbacks per 30 days: the counter must see trips
        assert result["budget_stress"]["realistic"]["1e+06"]["trips"] > 0
        for name in ("errors_5pct", "corruption_3pct", "mismatch_80pct"):
            assert result["faults"][name]["optimal_within_tolerance_statistic"] is not None
        assert (
            result["faults"]["drift_30pct_one_category"]["optimal_within_tolerance_pairs"] is None
        )
        assert result["faults"]["mismatch_80pct"]["tripped_by"] == "quality"
        # the correlated fault is judged again with the outage screen off, on the same pairs
        correlated = result["faults"]["correlated_fault"]
        assert correlated["fault"]["collateral"] == {"pairs": 3, "probability": 0.5}
        assert len(correlated["screen_off_pairs"]) == 1
        assert "screen_off_pairs_median" in correlated
        assert "screen_off_pairs_median" not in result["faults"]["errors_5pct"]
        dead = result["faults"]["dead_arm_flaky_baseline"]
        assert dead["fault"] == {"error_rate": 1.0, "baseline": {"error_rate": 0.7}}
        assert dead["canaryd_pairs"][0] is not None and dead["canaryd_pairs"][0] <= 100
        assert "hours_to_all_pass" in result["default_schedule"]
        config = result["config"]
        assert config["budget"]["false_rollbacks_per_30_days"] == pytest.approx(
            GatesConfig().budget.false_rollbacks_per_30_days
        )
        assert config["h"] == pytest.approx(lorden_threshold(config["detector_arl0"]))
        assert result["elapsed_s"] > 0

    def test_a_second_process_gives_the_same_figures(self) -> None:
        """`jobs=2` runs the faults, the drift pins and the schedule in a second process,
        which draws the realistic healthy sample again: every figure but the wall times
        equals the one-process run's."""

        def tiny(jobs: int) -> dict[str, Any]:
            result = gate_power.run(
                quick=True,
                seed=0,
                healthy_pairs=600,
                fault_seeds=1,
                cap=240,
                prefix_pairs=300,
                schedule_cap_hours=0.25,
                only_faults=("latency_x1.5", "mismatch_80pct"),
                stress_budgets=(),
                pins_per_category=2,
                cadence_pairs=60,
                jobs=jobs,
                log=lambda _: None,
            )
            return without_wall_times(result)

        one, two = tiny(1), tiny(2)
        assert one["config"].pop("jobs") == 1 and two["config"].pop("jobs") == 2
        assert set(two["faults"]) == {"latency_x1.5", "mismatch_80pct"}
        assert two["faults"]["mismatch_80pct"]["canaryd_pairs"][0] is not None
        assert one == two

    def test_the_trip_counter_counts_a_trip_and_restarts_the_evidence(self) -> None:
        """A gross fault (80 % greedy mismatch) trips the counted switch, which a human
        then restores: the trip is logged with its gate and the evidence starts again."""
        config = GatesConfig()
        model = gate_power.realistic().with_speculative(corrupt_rate=0.8)
        records = gate_power.PairStream(model, 0).take(120)
        counter = gate_power.TripCounter(config, every=6, live=10_000)
        for done in range(6, len(records) + 1, 6):
            window = records[:done]
            liveness = liveness_gate(
                window, config.liveness, now=window[-1].started_at, arl0=DEFAULT_ARL0
            )
            counter.observe(window, done, liveness, categories=3)
        assert counter.trips, counter.history[-1:]
        assert any("quality" in name for name in counter.trips[0]["by"])
        assert counter.state.reason == "restored" or counter.state.mode is SwitchMode.ROLLED_BACK
        summary = counter.summary(len(records))
        assert summary["trips"] == len(counter.trips) >= 1
        assert summary["trips_per_30_days_upper95"] > summary["trips_per_30_days"] > 0

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
            pairs, gate, _, _ = gate_power.canaryd_pairs_to_trip(
                prefix, gate_power.FaultStream(fault, 60), config, references, screen=6
            )
            assert gate == "quality"
            assert pairs is not None and pairs <= 30
            trips.append(pairs)
        assert statistics.median(trips) <= 20


class TestKayentaAtTheEdge:
    """The tolerant Kayenta-style judge is calibrated where canaryd's detectors are: an
    arm sitting exactly at the edge of the tolerance is rejected at about alpha, while
    Kayenta's own rule (a two-sided test at alpha and the effect past the tolerance)
    rejects it in a large share of windows. Seeded draws: the figures are fixed."""

    ALPHA = 0.05
    WINDOWS = 400

    @staticmethod
    def _rates(
        metric: str, draw: Callable[[np.random.Generator], tuple[list[float], list[float]]]
    ) -> tuple[float, float]:
        config = GatesConfig()
        fault = gate_power.Fault("edge", metric, {})
        edge = gate_power.kayenta_edge_test(fault, config)
        tolerant = gate_power.kayenta_tolerance(fault, config)
        rng = np.random.default_rng(11)
        at_edge = kayenta_rule = 0
        for _ in range(TestKayentaAtTheEdge.WINDOWS):
            canary, comparison = draw(rng)
            at_edge += edge(canary, comparison) < TestKayentaAtTheEdge.ALPHA
            p = mannwhitneyu(canary, comparison, alternative="two-sided").pvalue
            kayenta_rule += bool(p < TestKayentaAtTheEdge.ALPHA and tolerant(canary, comparison))
        return at_edge / TestKayentaAtTheEdge.WINDOWS, kayenta_rule / TestKayentaAtTheEdge.WINDOWS

    def test_latency_at_the_regression_tolerance(self) -> None:
        allowed = 1.0 + GatesConfig().latency.max_regression

        def draw(rng: np.random.Generator) -> tuple[list[float], list[float]]:
            canary = allowed * rng.lognormal(0.0, 0.5, 500)
            return canary.tolist(), rng.lognormal(0.0, 0.5, 500).tolist()

        at_edge, kayenta_rule = self._rates("e2e", draw)
        assert 0.02 <= at_edge <= 0.08  # 0.05 ± 2.7 sd of 400 windows: calibrated, not only safe
        assert kayenta_rule >= 0.3

    def test_acceptance_at_the_drop_tolerance(self) -> None:
        keep = 1.0 - GatesConfig().drift.max_relative_drop

        def draw(rng: np.random.Generator) -> tuple[list[float], list[float]]:
            canary = keep * rng.gamma(9.0, 0.3, 300)
            return canary.tolist(), rng.gamma(9.0, 0.3, 300).tolist()

        at_edge, kayenta_rule = self._rates("acceptance", draw)
        assert 0.02 <= at_edge <= 0.08
        assert kayenta_rule >= 0.3

    def test_errors_at_the_excess_tolerance(self) -> None:
        excess = GatesConfig().error.max_excess_rate

        def draw(rng: np.random.Generator) -> tuple[list[float], list[float]]:
            canary = rng.random(3000) < 0.01 + excess
            return canary.astype(float).tolist(), (rng.random(3000) < 0.01).astype(float).tolist()

        at_edge, _ = self._rates("error", draw)
        assert 0.02 <= at_edge <= 0.08

    def test_a_fault_past_the_edge_is_still_caught(self) -> None:
        """×1.5 e2e and a 5 % error rate reject at the production alpha in one window."""
        config = GatesConfig()
        rng = np.random.default_rng(5)
        e2e = gate_power.kayenta_edge_test(gate_power.Fault("x", "e2e", {}), config)
        slow = (1.5 * rng.lognormal(0.0, 0.5, 500)).tolist()
        assert e2e(slow, rng.lognormal(0.0, 0.5, 500).tolist()) < 1e-6
        errors = gate_power.kayenta_edge_test(gate_power.Fault("x", "error", {}), config)
        failing = (rng.random(3000) < 0.05).astype(float).tolist()
        assert errors(failing, (rng.random(3000) < 0.01).astype(float).tolist()) < 1e-6


class TestMedianInterval:
    def test_coverage_needs_six_seeds(self) -> None:
        """[x(k), x(n−k+1)] at ≥ 95 %: six seeds give [min, max] at 96.9 %; ten give
        [x(2), x(9)] at 97.9 %; three only [min, max] at 75 %; a censored run stays None."""
        assert gate_power.median_ci95([5, 1, 3, 2, 6, 4]) == ([1, 6], 0.9688)
        assert gate_power.median_ci95(list(range(10, 0, -1))) == ([2, 9], 0.9785)
        assert gate_power.median_ci95([3, None, 1]) == ([1, None], 0.75)


class TestDeploymentNoise:
    def test_ties_delays_and_bursts_as_described(self) -> None:
        """6,000 pairs of deployment_bf16: about 3 % of greedy pairs diverge, every one a
        tie by the quality gate's rule; 30 % of the pairs are sampled with a seed per arm,
        so their outputs differ and the likelihood delta centres on zero; both arms of a
        pair share the queueing delay (their TTFTs move together); failures come in bursts
        on top of the arms' own 1 %, and neither arm fails more than the other beyond
        noise."""
        model = gate_power.deployment_bf16()
        plain = gate_power.PairStream(gate_power.realistic(), 3).take(6000)
        noisy = gate_power.PairStream(model, 3).take(6000)
        margin = GatesConfig().quality.tie_margin_nats
        greedy = [r for r in noisy if r.scores is not None and r.temperature <= 0.0]
        ties = [r for r in greedy if not r.scores.exact_match]
        assert 0.015 < len(ties) / len(greedy) < 0.05
        assert all(r.scores.tie(margin) for r in ties)
        # 30 % sampled pairs, each arm with its own seed: two independent draws, scored
        sampled = [r for r in noisy if r.temperature > 0.0 and r.scores is not None]
        assert 0.27 < len(sampled) / len(noisy) < 0.33
        assert not any(r.scores.exact_match for r in sampled)
        deltas = [d for r in sampled if (d := r.scores.nll_delta) is not None]
        assert len(deltas) > 0.95 * len(sampled)
        assert abs(statistics.fmean(deltas)) < 4 * statistics.pstdev(deltas) / len(deltas) ** 0.5
        delays = [
            (n.baseline.ttft_s - p.baseline.ttft_s, n.speculative.ttft_s - p.speculative.ttft_s)
            for p, n in zip(plain, noisy, strict=True)
            if n.baseline.ok and n.speculative.ok and p.baseline.ok and p.speculative.ok
        ]
        assert all(b == pytest.approx(s) and b >= 0 for b, s in delays)
        failed = [sum(not r.baseline.ok for r in rs) for rs in (plain, noisy)]
        assert failed[1] > failed[0]
        spec_only = sum(1 for r in noisy if r.baseline.ok and not r.speculative.ok)
        base_only = sum(1 for r in noisy if not r.baseline.ok and r.speculative.ok)
        assert abs(spec_only - base_only) < 4 * (spec_only + base_only) ** 0.5


class TestNewScenarios:
    def test_collateral_fails_the_baselines_next_pairs(self) -> None:
        """`correlated_fault`'s noise: the speculative arm fails 10 % of its requests and
        each failure fails the baseline on each of the next 3 pairs with probability 1/2,
        so the baseline fails about 1.5 times as often as the speculative arm, and most
        of its failures follow a speculative failure within 3 pairs."""
        fault = next(f for f in faults(0.4) if f.name == "correlated_fault")
        records = gate_power.PairStream(fault.model(gate_power.realistic()), 3).take(4000)
        spec = [not r.speculative.ok for r in records]
        base = [not r.baseline.ok for r in records]
        assert 0.08 < sum(spec) / len(spec) < 0.12
        assert 1.2 < sum(base) / sum(spec) < 1.8
        after = sum(1 for i, b in enumerate(base) if b and any(spec[max(i - 3, 0) : i]))
        assert after > 0.85 * sum(base)
        assert all(r.scores is None for r, b in zip(records, base, strict=True) if b)

    def test_a_runner_up_kernel_ties_on_nearly_every_greedy_pair(self) -> None:
        """`runner_up_bug`'s noise: greedy outputs take the runner-up at 16.2 % of their
        positions with a gap under 0.5 nats, so nearly every greedy pair diverges, each
        divergence a tie within the 0.5-nat margin (no mismatch to count)."""
        fault = next(f for f in faults(0.4) if f.name == "runner_up_bug")
        records = gate_power.PairStream(fault.model(gate_power.deployment_bf16()), 2).take(600)
        greedy = [r.scores for r in records if r.scores is not None and r.temperature <= 0.0]
        tied = [s for s in greedy if s.tie(0.5)]
        assert len(greedy) > 300
        assert len(tied) > 0.9 * len(greedy)
        assert all(s.divergence_judge == "forced" for s in tied)

    def test_calibrate_first_stores_nothing_and_the_runner_up_bug_still_fails(self) -> None:
        """`calibrated_runner_up_bug`: on a deployment that reproduces its own greedy output
        the A/A run never diverges, so `canaryd calibrate` stores nothing although the
        arm's own divergences would have bounded a margin just under 0.5 nats; the
        configured margin judges, and the bug FAILs the quality gate within 300 pairs."""
        healthy = gate_power.HealthySample()
        for record in gate_power.PairStream(gate_power.realistic(), 0).take(200):
            healthy.add(record)
        result = gate_power.fault_runs(
            seeds=[0],
            cap=300,
            screen=60,
            config=GatesConfig(),
            healthy=healthy,
            only=["calibrated_runner_up_bug"],
            log=lambda _: None,
        )["calibrated_runner_up_bug"]
        (calibration,) = result["calibration"]
        assert calibration["aa_divergent_pairs"] == 0 and not calibration["stored"]
        assert calibration["ab_divergent_pairs"] > 119
        assert 0.45 < calibration["ab_alone_bound"] < 0.5
        assert calibration["margin_judged"] == GatesConfig().quality.tie_margin_nats
        assert "configured: gates.quality.tie_margin_nats" in calibration["tie_margin"]
        assert result["fault"] == {"deployment": {"runner_up_below": 0.5}, "calibrated": True}
        (pairs,) = result["canaryd_pairs"]
        assert pairs is not None and pairs <= 300 and result["tripped_by"] == "quality"

    def test_duplicated_pairs_replay_every_pair_from_a_second_run(self) -> None:
        """`duplicated_pairs`: each pair appears twice, the second from another run with
        the same prompt and seed, 5 s after the first; the pairs keep the 10 s pace."""
        records = gate_power.PairStream(gate_power.duplicated_pairs(), 0).take(40)
        for first, replay in zip(records[::2], records[1::2], strict=True):
            assert (replay.prompt, replay.sampling_seed) == (first.prompt, first.sampling_seed)
            assert replay.run_id != first.run_id and replay.pair_id != first.pair_id
            assert (replay.baseline, replay.speculative) == (first.baseline, first.speculative)
            assert (replay.started_at - first.started_at).total_seconds() == 5.0
        assert (records[2].started_at - records[0].started_at).total_seconds() == 10.0

    def test_healthy_stalls_run_in_burst_cycles_that_share_a_stall(self) -> None:
        """`healthy_stalls`: pairs start in cycles of 4 (each once the cycle before ended,
        about one pair every 10 s), and about 2 % of the cycles have one arm slowed 3–20×,
        the same arm in all 4 pairs; the latency gate sees one concurrent group per cycle."""
        stalled = gate_power.healthy_stalls()
        calm = replace(stalled, stalls=replace(stalled.stalls, rate=0.0))
        records = gate_power.PairStream(stalled, 3).take(8000)
        baseline = gate_power.PairStream(calm, 3).take(8000)
        cycles = [records[i : i + 4] for i in range(0, len(records), 4)]
        assert all(len({r.started_at.replace(microsecond=0) for r in c}) <= 2 for c in cycles)
        assert concurrent_groups(records) == [i // 4 for i in range(len(records))]
        hit = 0
        for k, cycle in enumerate(cycles):
            calm_cycle = baseline[4 * k : 4 * k + 4]
            factors = {
                arm: [
                    getattr(r, arm).e2e_s / getattr(c, arm).e2e_s
                    for r, c in zip(cycle, calm_cycle, strict=True)
                ]
                for arm in ("baseline", "speculative")
            }
            slowed = [arm for arm, f in factors.items() if f[0] > 1.0 + 1e-9]
            if slowed:
                hit += 1
                (arm,) = slowed
                assert all(3.0 <= f <= 20.0 for f in factors[arm])
                assert len({round(f, 9) for f in factors[arm]}) == 1
        assert 0.01 < hit / len(cycles) < 0.03, hit
        span = (records[-1].started_at - records[0].started_at).total_seconds()
        assert 9.0 < span / len(records) < 11.0

    def test_scheduled_pairs_never_overlap(self) -> None:
        """A pair starts once the one before it ended: the realistic model's pairs are a
        concurrent group each, stalls ×5 and all."""
        records = gate_power.PairStream(gate_power.realistic(), 0).take(3000)
        assert concurrent_groups(records) == list(range(len(records)))

    def test_flaky_infrastructure_fails_both_arms_alike(self) -> None:
        """`flaky_infra_10pct`: each arm fails about 10 % of its requests, independently."""
        records = gate_power.PairStream(gate_power.flaky_infra(), 1).take(3000)
        for arm in ("baseline", "speculative"):
            rate = sum(not getattr(r, arm).ok for r in records) / len(records)
            assert 0.08 < rate < 0.12, (arm, rate)


class TestCommand:
    @pytest.mark.parametrize(
        "invocation",
        [["benchmarks/gate_power"], ["-m", "benchmarks.gate_power"]],
        ids=["folder", "module"],
    )
    def test_both_invocations_reach_the_command(self, invocation: list[str]) -> None:
        """`python benchmarks/gate_power` and `python -m benchmarks.gate_power`, run from
        the repository root without PYTHONPATH as the docs say, both reach the command:
        exit 0 and the help names the benchmark and its options."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        run = subprocess.run(
            [sys.executable, *invocation, "--help"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert "How often the production gates roll back healthy traffic" in run.stdout
        for option in ("--quick", "--out", "--jobs", "--refit"):
            assert option in run.stdout
