"""The fallback rate in the drift gate: pinned beside the acceptance reference, judged as a
WARN-only signal that never FAILs, carries no detector and so takes no budget."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from engine.types import SpeculativeStats
from gates.config import DriftGateConfig
from gates.core import GateState
from gates.pairs.drift import drift_gate, grow_references, pin_reference
from gates.pairs.drift_fallback import fallback_key, fallback_rates, pin_fallback
from gates.pairs.testing import at, record, result
from gates.records import PairRecord
from gates.stats.budget import DEFAULT_ARL0, DEFAULT_DETECTOR_BUDGET


def records(
    count: int, *, kept_share: float, accepted: int = 30, first: int = 0, seed: int = 0
) -> list[PairRecord]:
    """`count` code pairs of 20 verify steps and `accepted` accepted tokens each (acceptance
    length 1 + accepted / 20); about `kept_share` of the steps keep a draft token."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        kept = min(20, max(1, round(rng.gauss(kept_share * 20, 2.0))))
        noise = rng.randint(-3, 3)
        stats = SpeculativeStats(20, 80, accepted + noise, (kept, max(0, accepted + noise - kept)))
        speculative = replace(
            result(0.5, output_tokens=20 + accepted + noise, verify_steps=20), speculative=stats
        )
        rows.append(record(first + i, speculative=speculative, category="code"))
    return rows


class TestPins:
    def test_pin_is_the_mean_and_sd_of_the_rate_per_pair(self) -> None:
        """The fallback pin of a category: its per-pair fallback rates' mean, sd and count,
        under the category's fallback key; too few pairs give none."""
        rows = records(40, kept_share=0.75)
        rates = fallback_rates(rows)["code"]
        pinned = pin_fallback(rows, ["code"], min_samples=30)[fallback_key("code")]
        assert pinned.n == 40
        assert pinned.mean == pytest.approx(sum(rates) / 40)
        assert pinned.mean == pytest.approx(0.25, abs=0.03)
        assert pin_fallback(rows[:20], ["code"], min_samples=30) == {}

    def test_a_new_category_gets_both_pins_from_the_same_pairs(self) -> None:
        """grow_references pins the acceptance reference and the fallback pin together."""
        rows = records(40, kept_share=0.75)
        pinned = grow_references(
            rows,
            {},
            DriftGateConfig(),
            now=at(40),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert set(pinned) == {"code", "code:fallback"}
        assert pinned["code"].n == pinned["code:fallback"].n == 40

    def test_a_pinned_category_without_a_fallback_pin_gets_one(self) -> None:
        """An acceptance pin from before fallback pins (at its target) gains a fallback pin
        from the category's pairs, and only that."""
        rows = records(250, kept_share=0.75)
        frozen = pin_reference(rows[:200])
        pinned = grow_references(
            rows,
            frozen,
            DriftGateConfig(),
            now=at(250),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert set(pinned) == {"code:fallback"} and pinned["code:fallback"].n == 200
        assert (
            grow_references(
                rows,
                {**frozen, **pinned},
                DriftGateConfig(),
                now=at(250),
                arl0=DEFAULT_ARL0,
                budget_30d=DEFAULT_DETECTOR_BUDGET,
            )
            == {}
        )


class TestJudging:
    def test_healthy_fallbacks_say_nothing(self) -> None:
        """With the fallback rate as pinned, the drift decision is exactly the one without a
        fallback pin: the signal adds no component and no words."""
        refs = grow_references(
            records(200, kept_share=0.75),
            {},
            DriftGateConfig(),
            now=at(200),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        window = records(300, kept_share=0.75, first=200, seed=1)
        config = DriftGateConfig()
        with_pin = drift_gate(
            window,
            config,
            now=at(500),
            references=refs,
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        without = drift_gate(
            window,
            config,
            now=at(500),
            references={"code": refs["code"]},
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert with_pin == without
        assert with_pin.state is GateState.PASS

    def test_more_fallbacks_at_the_same_acceptance_warn_and_never_fail(self) -> None:
        """Half the steps keeping a draft token where three quarters did, at the same
        acceptance length: the acceptance check PASSes, the fallback signal WARNs, with no
        sequential detector of its own."""
        refs = grow_references(
            records(200, kept_share=0.75),
            {},
            DriftGateConfig(),
            now=at(200),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        window = records(300, kept_share=0.45, first=200, seed=2)
        decision = drift_gate(
            window,
            DriftGateConfig(),
            now=at(500),
            references=refs,
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert decision.state is GateState.WARN
        by_name = {c.name: c for c in decision.components}
        assert by_name["drift.code"].state is GateState.PASS
        fallback = by_name["drift.code.fallback"]
        assert fallback.state is GateState.WARN and fallback.detector is None
        assert fallback.estimate == pytest.approx(0.4, abs=0.05)
        assert "fallback rate" in fallback.detail and "WARN-only" in fallback.detail
        assert decision.categories == ("code",)

    def test_an_acceptance_collapse_still_fails_by_acceptance(self) -> None:
        """When acceptance falls too, the acceptance check FAILs the gate as before; the
        fallback signal stands beside it as a WARN."""
        refs = grow_references(
            records(200, kept_share=0.75),
            {},
            DriftGateConfig(),
            now=at(200),
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        window = records(300, kept_share=0.3, accepted=8, first=200, seed=3)
        decision = drift_gate(
            window,
            DriftGateConfig(),
            now=at(500),
            references=refs,
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )
        assert decision.state is GateState.FAIL
        states = {c.name: c.state for c in decision.components}
        assert states == {"drift.code": GateState.FAIL, "drift.code.fallback": GateState.WARN}
