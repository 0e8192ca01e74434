"""The latency gate's `itl` metric: each generation's P99 gap between tokens, judged
speculative against baseline like e2e, and only when configured."""

from __future__ import annotations

import pytest

from gates import GateState, latency_gate
from gates.config import LatencyGateConfig, LatencySLO
from gates.pairs.testing import at, record, result
from gates.records import PairRecord
from gates.stats.budget import DEFAULT_ARL0, DEFAULT_DETECTOR_BUDGET

ITL = LatencyGateConfig(metrics=("itl",), min_samples=50, bootstrap_resamples=200)


def bursty(n: int, itl_factor: float) -> list[PairRecord]:
    """Speculative e2e half the baseline's (faster on average), its P99 gap between
    tokens `itl_factor` × the baseline's (0.05..0.1 s)."""
    return [
        record(
            i,
            baseline=result(1.0, itl_p99=0.05 + (i % 50) / 1000),
            speculative=result(0.5, itl_p99=(0.05 + (i % 50) / 1000) * itl_factor),
        )
        for i in range(n)
    ]


class TestItlMetric:
    def test_bursty_stalls_fail_the_gate(self) -> None:
        """A speculative arm twice as fast end to end whose P99 gaps are 3× the
        baseline's: FAIL on itl, with the ratio as evidence."""
        decision = latency_gate(
            bursty(200, 3.0),
            ITL,
            now=at(200),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert decision.state is GateState.FAIL
        assert [c.name for c in decision.components] == ["latency.itl.median", "latency.itl.p99"]
        assert decision.estimate == pytest.approx(3.0)

    def test_smooth_delivery_passes(self) -> None:
        """P99 gaps 0.8× the baseline's: PASS."""
        decision = latency_gate(
            bursty(200, 0.8),
            ITL,
            now=at(200),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert decision.state is GateState.PASS

    def test_itl_is_not_judged_by_default(self) -> None:
        """The default metrics (e2e, ttft, tpot) leave itl out: the same stalls PASS."""
        config = LatencyGateConfig(min_samples=50, bootstrap_resamples=200)
        assert "itl" not in config.metrics
        decision = latency_gate(
            bursty(200, 3.0),
            config,
            now=at(200),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert not any(".itl." in c.name for c in decision.components)
        assert decision.state is GateState.PASS

    def test_generations_without_itl_are_not_reported(self) -> None:
        """Arms that report no ITL (one-token answers, untimed engines) give no data."""
        records = [record(i) for i in range(100)]
        decision = latency_gate(
            records, ITL, now=at(100), arl0=DEFAULT_ARL0, budget_30d=DEFAULT_DETECTOR_BUDGET
        )
        assert decision.state is GateState.NODATA

    def test_an_itl_slo(self) -> None:
        """An absolute SLO on the speculative P99 gap: 0.3 s P99 gaps fail a 0.2 s SLO."""
        config = LatencyGateConfig(
            metrics=("e2e",),
            slos=(LatencySLO(metric="itl", quantile=0.9, max_seconds=0.2),),
            min_samples=50,
            bootstrap_resamples=200,
        )
        decision = latency_gate(
            bursty(200, 4.0),
            config,
            now=at(200),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        slo = next(c for c in decision.components if "itl" in c.name)
        assert slo.state is GateState.FAIL
