"""Multi-chart CUSUMs: the bank's threshold pays for its charts, the chart nearest the
real change decides, and the drift and latency gates use them so that gross changes are
caught at their own chart's speed while noise and single stalls cannot alarm."""

from __future__ import annotations

import math
import random
from typing import ClassVar

from gates import GateState, drift_gate, latency_gate
from gates.config import DriftGateConfig, LatencyGateConfig
from gates.pairs.drift import ReferenceStats, pin_reference
from gates.pairs.testing import at, record, result
from gates.records import PairRecord
from gates.stats.budget import DEFAULT_ARL0, DEFAULT_DETECTOR_BUDGET
from gates.stats.sequential import cusum_bank, gaussian_llr, llr_cusum

H = 17.0


class TestCusumBank:
    def test_threshold_pays_log_of_the_chart_count(self) -> None:
        _, _, h = cusum_bank([[0.1], [0.2], [0.3]], H)
        assert h == H + math.log(3)

    def test_the_chart_nearest_the_change_decides(self) -> None:
        rng = random.Random(1)
        values = [rng.gauss(0.5, 1.0) for _ in range(400)]  # a shift of 0.5 sd
        small = gaussian_llr(values, 0.0, 0.1, 1.0)
        matched = gaussian_llr(values, 0.0, 0.5, 1.0)
        cusum, chart, _ = cusum_bank([small, matched], H)
        assert chart == 1
        assert cusum.alarm_index is not None
        alone = llr_cusum(small, H)
        assert alone.alarm_index is None or cusum.alarm_index < alone.alarm_index

    def test_every_charts_peak_is_seen(self) -> None:
        """A chart that alarmed and fell back is not hidden behind the chart that is
        highest now: the bank's reading carries the largest peak and the earliest alarm
        of any chart (both charts' peaks of a two-chart detector)."""
        burst = [10.0] * 3 + [-10.0] * 3  # chart 0: up to 30, then back to 0
        steady = [0.5] * 6  # chart 1: 3.0 at the end, the highest now
        cusum, chart, h = cusum_bank([burst, steady], 25.0)
        assert chart == 1 and cusum.statistic == 3.0
        assert cusum.peak == 30.0 >= h
        assert cusum.alarm_index == 2
        alone = llr_cusum(steady, h)
        assert alone.peak == 3.0 and alone.alarm_index is None

    def test_in_control_data_stays_quiet(self) -> None:
        rng = random.Random(2)
        values = [rng.gauss(0.0, 1.0) for _ in range(5_000)]
        charts = [gaussian_llr(values, 0.0, shift, 1.0) for shift in (0.2, 0.5, 1.0)]
        cusum, _, h = cusum_bank(charts, H)
        assert cusum.peak < h / 2


def _drift_records(n: int, mean: float, sd: float, seed: int) -> list[PairRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = min(max(rng.gauss(mean, sd), 1.0), 9.0)
        steps = 20
        out.append(
            record(
                i,
                speculative=result(output_tokens=round(length * steps), verify_steps=steps),
                category="code",
            )
        )
    return out


class TestDriftBank:
    CONFIG = DriftGateConfig(min_samples=20)
    REFERENCE: ClassVar[dict[str, ReferenceStats]] = {
        "code": ReferenceStats(mean=2.8, sd=0.86, n=2_000)
    }

    def _first_fail(self, records: list[PairRecord]) -> int | None:
        for n in range(10, len(records) + 1, 5):
            decision = drift_gate(
                records[:n],
                self.CONFIG,
                now=at(n),
                references=self.REFERENCE,
                arl0=DEFAULT_ARL0,
                budget_30d=DEFAULT_DETECTOR_BUDGET,
            )
            if decision.state is GateState.FAIL:
                return n
        return None

    def test_a_gross_drop_is_caught_by_the_gross_chart(self) -> None:
        records = _drift_records(200, 2.8 * 0.7, 0.86 * 0.7, seed=3)
        decision = drift_gate(
            records,
            self.CONFIG,
            now=at(200),
            references=self.REFERENCE,
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert decision.state is GateState.FAIL
        assert "(chart 2 of 2)" in decision.components[0].detail
        found = self._first_fail(records)
        assert found is not None and found <= 60

    def test_healthy_category_does_not_alarm(self) -> None:
        records = _drift_records(2_000, 2.8, 0.86, seed=4)
        decision = drift_gate(
            records,
            self.CONFIG,
            now=at(2_000),
            references=self.REFERENCE,
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert decision.state is not GateState.FAIL
        assert "peak" in decision.components[0].detail

    def test_a_drop_within_the_tolerance_does_not_alarm(self) -> None:
        records = _drift_records(2_000, 2.8 * 0.96, 0.86, seed=5)
        decision = drift_gate(
            records,
            self.CONFIG,
            now=at(2_000),
            references=self.REFERENCE,
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert decision.state is not GateState.FAIL


def _latency_records(ratios: list[float]) -> list[PairRecord]:
    return [
        record(i, baseline=result(e2e=1.0, ttft=0.1), speculative=result(e2e=r, ttft=0.1 * r))
        for i, r in enumerate(ratios)
    ]


class TestLatencyShift:
    CONFIG = LatencyGateConfig(metrics=("ttft",), min_samples=50)

    def test_a_broad_slowdown_past_the_tolerance_fails(self) -> None:
        rng = random.Random(6)
        ratios = [math.exp(rng.gauss(math.log(1.6), 0.3)) for _ in range(150)]
        decision = latency_gate(
            _latency_records(ratios),
            self.CONFIG,
            now=at(150),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        median = next(c for c in decision.components if c.name == "latency.ttft.median")
        assert median.state is GateState.FAIL

    def test_stalls_alone_cannot_alarm(self) -> None:
        rng = random.Random(7)
        ratios = [math.exp(rng.gauss(0.0, 0.3)) for _ in range(500)]
        for i in range(0, 500, 25):  # 4 % of pairs 20× slower on the speculative arm
            ratios[i] = 20.0
        decision = latency_gate(
            _latency_records(ratios),
            self.CONFIG,
            now=at(500),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        median = next(c for c in decision.components if c.name == "latency.ttft.median")
        assert median.state is not GateState.FAIL
        assert "sign CUSUM" in median.detail

    def test_a_slowdown_within_the_tolerance_does_not_alarm(self) -> None:
        rng = random.Random(8)
        ratios = [math.exp(rng.gauss(math.log(1.05), 0.3)) for _ in range(3_000)]
        decision = latency_gate(
            _latency_records(ratios),
            self.CONFIG,
            now=at(3_000),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        median = next(c for c in decision.components if c.name == "latency.ttft.median")
        assert median.state is not GateState.FAIL


class TestDriftLogChart:
    CONFIG = DriftGateConfig(min_samples=20)

    def test_pinned_references_carry_log_figures(self) -> None:
        healthy = _drift_records(400, 2.8, 0.86, seed=9)
        reference = pin_reference(healthy, min_samples=30)["code"]
        assert reference.log_mean is not None and reference.log_sd is not None
        assert math.exp(reference.log_mean) < reference.mean  # Jensen: a real log mean
        assert 0.1 < reference.log_sd < 0.6

    def test_a_proportional_drop_is_caught_on_the_log_scale(self) -> None:
        healthy = _drift_records(400, 2.8, 0.86, seed=10)
        references = pin_reference(healthy, min_samples=30)
        faulty = _drift_records(300, 2.8 * 0.7, 0.86 * 0.7, seed=11)
        decision = drift_gate(
            faulty,
            self.CONFIG,
            now=at(300),
            references=references,
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert decision.state is GateState.FAIL
        assert "(chart 2 of 2)" in decision.components[0].detail

    def test_healthy_traffic_against_its_own_pin_stays_quiet(self) -> None:
        healthy = _drift_records(400, 2.8, 0.86, seed=12)
        references = pin_reference(healthy, min_samples=30)
        later = _drift_records(2_000, 2.8, 0.86, seed=13)
        decision = drift_gate(
            later,
            self.CONFIG,
            now=at(2_000),
            references=references,
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert decision.state is not GateState.FAIL
