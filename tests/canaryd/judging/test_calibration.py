"""The calibrated tie margin on the judging path: the margin stored under the arms' key
(read by canaryd.judging.reader.tie_margin_for) replaces `tie_margin_nats` in a copy of the
gates config (`gates.evidence.Evidence.judged_config`) and is named in the quality
decision's detail; a changed arm configuration reads the configured margin again; a
divergence 0.3 nats wide is real under a calibrated 0.2 and a tie under the configured
0.5, in `gates.cycle.judge` and in the gate job against a real database. And `calibrate`
itself (canaryd.judging.calibration) on the tiny random model with a noisy prompt-lookup
arm."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from canaryd.config import Settings
from canaryd.config.arms import arm_key
from canaryd.judging.calibration import calibrate
from canaryd.judging.gatejob import SwitchGates
from canaryd.judging.reader import tie_margin_for
from canaryd.store import SqlStore, TieMargin
from gates import GateDecision
from gates.core import GateState
from gates.cycle import judge
from gates.evidence import Evidence, MarginSource
from gates.pairs.testing import record, scores
from gates.records import DEFAULT_ARM, PairRecord, RunInfo

T0 = datetime(2026, 3, 2, 10, 30, tzinfo=UTC)
DRY = {"mode": "dry_run"}


def settings(url: str, tmp_path: Path, draft_tokens: int = 4) -> Settings:
    """Fake engines (no model to load); every gate dry-run but quality's checks judged."""
    return Settings(
        storage={"url": url},
        switch={"state_file": str(tmp_path / "switch.json")},
        arms={
            "baseline": {"kind": "fake", "seed": 1},
            DEFAULT_ARM: {
                "kind": "fake",
                "speculative": True,
                "seed": 1,
                "num_draft_tokens": draft_tokens,
            },
        },
        gates={
            "liveness": DRY,
            "error": DRY,
            "latency": DRY,
            "quality": {**DRY, "min_samples": 20},
            "speedup": DRY,
            "drift": DRY,
        },
    )


def calibrated(s: Settings, margin: float = 0.2) -> TieMargin:
    return TieMargin(
        arms=arm_key(s, DEFAULT_ARM),
        arm=DEFAULT_ARM,
        margin=margin,
        divergences=240,
        aa=12,
        ab=228,
        unmeasured=0,
        pairs=400,
        coverage=0.975,
        confidence=0.95,
        calibrated_at=T0,
    )


def diverging(n: int, *, start: datetime | None = None) -> list[PairRecord]:
    """n greedy pairs, one in five diverging 0.3 nats from the baseline's choice."""
    return [
        record(
            i,
            pair_scores=scores(exact=i % 5 != 0, margin=None if i % 5 else 0.3),
            started_at=None if start is None else start + timedelta(seconds=i),
        )
        for i in range(n)
    ]


def component(decisions: tuple[GateDecision, ...] | list[GateDecision], name: str) -> GateDecision:
    quality = next(d for d in decisions if d.name == "quality")
    return next(c for c in quality.components if c.name == name)


@pytest.fixture
def store(database_url: str) -> Iterator[SqlStore]:
    with SqlStore.open(database_url, create=True) as opened:
        yield opened


class TestTieMarginFor:
    def test_without_a_calibration_the_configured_margin(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        s = settings(database_url, tmp_path)
        source = tie_margin_for(store, s, DEFAULT_ARM, s.gates)
        assert Evidence(tie_margin=source).judged_config(s.gates) is s.gates
        assert source == MarginSource(0.5, "configured")
        assert "configured: gates.quality.tie_margin_nats" in source.describe()

    def test_the_calibrated_margin_in_a_copy(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        s = settings(database_url, tmp_path)
        store.save_tie_margin(calibrated(s))
        source = tie_margin_for(store, s, DEFAULT_ARM, s.gates)
        config = Evidence(tie_margin=source).judged_config(s.gates)
        assert config.quality.tie_margin_nats == 0.2
        assert s.gates.quality.tie_margin_nats == 0.5  # the operator's config untouched
        assert config.quality.mode == s.gates.quality.mode
        assert source.describe() == (
            "tie margin 0.2 nats (calibrated at 2026-03-02T10:30:00+00:00 from 240 divergences)"
        )

    def test_a_changed_arm_reads_the_configured_margin_again(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """Another draft length is another arms key: its old calibration is not read."""
        store.save_tie_margin(calibrated(settings(database_url, tmp_path)))
        changed = settings(database_url, tmp_path, draft_tokens=8)
        source = tie_margin_for(store, changed, DEFAULT_ARM, changed.gates)
        config = Evidence(tie_margin=source).judged_config(changed.gates)
        assert source.origin == "configured" and config.quality.tie_margin_nats == 0.5


class TestJudgedWithTheCalibratedMargin:
    def test_a_divergence_wider_than_the_calibrated_margin_is_real(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """0.3 nats: a tie under the configured 0.5 (no mismatch counted), real under a
        calibrated 0.2 (one pair in five: mismatch FAIL)."""
        s = settings(database_url, tmp_path)
        records = diverging(200)
        now = records[-1].started_at + timedelta(seconds=1)
        configured = judge(Evidence(records), s.gates, now).decisions
        mismatch = component(configured, "quality.mismatch")
        assert mismatch.state is not GateState.FAIL
        assert "numeric ties 40/200" in mismatch.detail, mismatch.detail
        store.save_tie_margin(calibrated(s))
        source = tie_margin_for(store, s, DEFAULT_ARM, s.gates)
        judged = judge(Evidence(records, tie_margin=source), s.gates, now).decisions
        mismatch = component(judged, "quality.mismatch")
        assert mismatch.state is GateState.FAIL, mismatch.detail
        quality = next(d for d in judged if d.name == "quality")
        assert "tie margin 0.2 nats (calibrated at" in quality.detail

    def test_the_gate_job_judges_with_it_and_says_so(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """Stored pairs, a stored calibration for the switch's arm: the gate job's quality
        decision counts the 0.3-nat divergences and names the calibrated margin."""
        s = settings(database_url, tmp_path)
        start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
        store.create_run(RunInfo("test", "daemon", start, {}, "h", {}, {}, {}))  # type: ignore[arg-type]
        for pair in diverging(100, start=start):
            store.save_pair(pair)
        now = start + timedelta(seconds=101)
        gates = SwitchGates(s, store=store)
        try:
            gates.evaluate(now)
            before = store.latest_evaluation()
            store.save_tie_margin(calibrated(s))
            gates.evaluate(now + timedelta(seconds=1))
            after = store.latest_evaluation()
        finally:
            gates.close()
        assert before is not None and after is not None
        assert component(before.decisions, "quality.mismatch").state is not GateState.FAIL
        quality = next(d for d in before.decisions if d.name == "quality")
        assert "tie margin 0.5 nats (configured" in quality.detail
        assert component(after.decisions, "quality.mismatch").state is GateState.FAIL
        quality = next(d for d in after.decisions if d.name == "quality")
        assert "tie margin 0.2 nats (calibrated at 2026-03-02T10:30:00+00:00" in quality.detail


@pytest.mark.slow
class TestCalibrateOnTheTinyModel:
    def test_noisy_prompt_lookup_diverges_and_the_baseline_does_not(self) -> None:
        """The tiny random model, greedy: the baseline against itself never diverges (one
        deterministic engine); a prompt-lookup arm with ±0.4 logit noise diverges, each
        divergent token judged within twice the noise; 20 prompts give fewer than the 119
        divergences a bound needs, so nothing would be stored."""
        from engine.config import SpeculativeConfig, TransformersEngineConfig
        from engine.hf import TransformersEngine
        from engine.testing import tiny_llama
        from tests.canaryd.scoring.test_ties import prompt

        model, tokenizer = tiny_llama(seed=0)
        baseline = TransformersEngine(
            TransformersEngineConfig(model="tiny", warmup_tokens=2),
            model=model,
            tokenizer=tokenizer,
        )
        spec = SpeculativeConfig(method="prompt_lookup", num_draft_tokens=4, numeric_noise=0.4)
        speculative = TransformersEngine(
            TransformersEngineConfig(model="tiny", speculative=spec, warmup_tokens=2),
            model=model,
            tokenizer=tokenizer,
        )
        engines: dict[str, Any] = {"baseline": baseline, DEFAULT_ARM: speculative}
        result = calibrate(Settings(), engines, DEFAULT_ARM, [prompt(i) for i in range(20)])
        assert result.pairs == 40 and result.failures == 0
        assert result.aa_margins == ()
        assert result.ab_margins, "near-uniform logits with noise should diverge somewhere"
        assert all(0.0 < m <= 0.8 + 1e-4 for m in result.ab_margins), result.ab_margins
        assert result.divergences < result.needed == 119
        assert result.bound is None and result.stored() is None
        bounded = replace(result, bound=0.3)
        row = bounded.stored()
        assert row is not None and row.margin == 0.3 and row.ab == len(result.ab_margins)
