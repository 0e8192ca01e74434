"""Drift attribution: with live traffic beside the suites, the drift gate's evidence
names the cause — the engine (a control suite dropped too), the traffic (controls held,
live dropped, the live mix moved: the live categories only WARN), or unclear."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import ClassVar

from gates import GateDecision, GateState, drift_gate
from gates.config import DriftGateConfig
from gates.pairs.attribution import attribute_drift, mix_shift
from gates.pairs.drift import ReferenceStats
from gates.pairs.testing import at, record, result
from gates.records import PairRecord
from gates.stats.budget import DEFAULT_ARL0, DEFAULT_DETECTOR_BUDGET

HEALTHY, DROPPED = 2.8, 1.6


def pair(
    index: int, category: str, length: float, *, live: bool, prompt_tokens: int = 50
) -> PairRecord:
    steps = 20
    speculative = result(output_tokens=round(length * steps), verify_steps=steps)
    return record(
        index,
        baseline=replace(result(), prompt_tokens=prompt_tokens),
        speculative=speculative,
        category=category,
        source="live" if live else "control",
    )


def soak(
    n: int,
    *,
    control_after: float,
    live_after: float,
    tokens_before: int = 300,
    tokens_after: int = 40,
    seed: int = 1,
) -> list[PairRecord]:
    """`n` control pairs (`code`) and `n` live ones (`live`) interleaved; from the
    middle on, acceptance lengths move to the `_after` means and live prompts to
    `tokens_after` tokens."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        late = i >= n // 2
        control = (control_after if late else HEALTHY) + rng.gauss(0, 0.3)
        live = (live_after if late else HEALTHY) + rng.gauss(0, 0.3)
        tokens = tokens_after if late else tokens_before
        out.append(pair(2 * i, "code", control, live=False))
        out.append(pair(2 * i + 1, "live", live, live=True, prompt_tokens=tokens))
    return out


class TestDriftAttribution:
    CONFIG = DriftGateConfig(min_samples=20)
    REFERENCES: ClassVar[dict[str, ReferenceStats]] = {
        "code": ReferenceStats(mean=HEALTHY, sd=0.3, n=2_000),
        "live": ReferenceStats(mean=HEALTHY, sd=0.3, n=2_000),
    }

    def decide(self, records: list[PairRecord]) -> GateDecision:
        now = max(r.started_at for r in records) + (at(1) - at(0))
        return drift_gate(
            records,
            self.CONFIG,
            now=now,
            references=self.REFERENCES,
            arl0=DEFAULT_ARL0,
            budget_30d=DEFAULT_DETECTOR_BUDGET,
        )

    def test_traffic_change_warns_and_names_the_traffic(self) -> None:
        """Controls held, live dropped as its prompts changed: WARN, cause traffic."""
        decision = self.decide(soak(120, control_after=HEALTHY, live_after=DROPPED))
        assert decision.state is GateState.WARN
        assert "cause: traffic" in decision.detail
        assert "controls held (code)" in decision.detail

    def test_engine_change_fails_and_names_the_engine(self) -> None:
        """The control suite dropped too: FAIL, cause engine."""
        decision = self.decide(soak(120, control_after=DROPPED, live_after=DROPPED))
        assert decision.state is GateState.FAIL
        assert "cause: engine" in decision.detail

    def test_live_drop_without_a_mix_move_still_fails(self) -> None:
        """Live dropped, controls held, but the prompts look the same: FAIL, unclear."""
        records = soak(120, control_after=HEALTHY, live_after=DROPPED, tokens_after=300)
        decision = self.decide(records)
        assert decision.state is GateState.FAIL
        assert "cause: unclear" in decision.detail

    def test_suites_only_name_no_cause(self) -> None:
        """Without live pairs the decision is what it always was: no cause named."""
        records = [
            r for r in soak(120, control_after=DROPPED, live_after=DROPPED) if r.source == "control"
        ]
        decision = self.decide(records)
        assert decision.state is GateState.FAIL
        assert "cause:" not in decision.detail


class TestMixShift:
    def test_category_shares_and_prompt_length(self) -> None:
        """The halves' category shares (TVD) and mean prompt tokens are compared."""
        older = [pair(i, "code", HEALTHY, live=True, prompt_tokens=100) for i in range(20)]
        newer = [pair(20 + i, "chat", HEALTHY, live=True, prompt_tokens=100) for i in range(20)]
        shift = mix_shift(older + newer)
        assert shift is not None
        assert shift.share_distance == 1.0 and shift.moved
        assert mix_shift(older[:10]) is None

    def test_no_flagged_category_no_attribution(self) -> None:
        """Nothing dropped: nothing to attribute."""
        assert attribute_drift(soak(40, control_after=HEALTHY, live_after=HEALTHY), (), ()) is None
