"""The calibrated tie margin on the judging path: the margin stored under the arms' key
(read by canaryd.judging.reader.tie_margin_for) replaces `tie_margin_nats` in a copy of the
gates config (`gates.evidence.Evidence.judged_config`) and is named in the quality
decision's detail; a changed arm configuration, an expired margin, other engines and a
row from before the A/A-only rule read the configured margin again, and say why; a
divergence 0.3 nats wide is real under a calibrated 0.2 and a tie under the configured
0.5, in `gates.cycle.judge` and in the gate job against a real database. And the
calibration itself (canaryd.judging.calibration): only A/A pairs set the margin, one
margin per divergent pair, a bound that covers on clustered margins; `calibrate` on the
tiny random model with a noisy prompt-lookup arm."""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from canaryd.config import Settings
from canaryd.config.arms import arm_key
from canaryd.judging.calibration import Calibration, RunDivergences, engines_key
from canaryd.judging.gatejob import SwitchGates
from canaryd.judging.reader import tie_margin_for
from canaryd.scoring.calibrate import Measured, tail_bound
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


# The engines of the run the gate job's pairs are stored under (`RUN`): fake identities.
ENGINES = engines_key({}, {}, {})


def calibrated(
    s: Settings, margin: float = 0.2, at: datetime = T0, engines: str = ENGINES
) -> TieMargin:
    return TieMargin(
        arms=arm_key(s, DEFAULT_ARM),
        arm=DEFAULT_ARM,
        margin=margin,
        divergences=900,
        aa=660,
        ab=240,
        unmeasured=0,
        pairs=800,
        coverage=0.975,
        confidence=0.95,
        calibrated_at=at,
        aa_arm="baseline",
        aa_divergent_pairs=240,
        engines=engines,
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
        source = tie_margin_for(store, s, DEFAULT_ARM, s.gates, T0)
        assert Evidence(tie_margin=source).judged_config(s.gates) is s.gates
        assert source == MarginSource(0.5, "configured")
        assert "configured: gates.quality.tie_margin_nats" in source.describe()

    def test_the_calibrated_margin_in_a_copy(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        s = settings(database_url, tmp_path)
        store.save_tie_margin(calibrated(s))
        source = tie_margin_for(store, s, DEFAULT_ARM, s.gates, T0 + timedelta(days=1), ENGINES)
        config = Evidence(tie_margin=source).judged_config(s.gates)
        assert config.quality.tie_margin_nats == 0.2
        assert s.gates.quality.tie_margin_nats == 0.5  # the operator's config untouched
        assert config.quality.mode == s.gates.quality.mode
        assert source.describe() == (
            "tie margin 0.2 nats (calibrated at 2026-03-02T10:30:00+00:00 from 240 divergent "
            "A/A pairs, the baseline against itself, until 2026-04-01T10:30:00+00:00)"
        )

    def test_a_changed_arm_reads_the_configured_margin_again(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """Another draft length is another arms key: its old calibration is not read."""
        store.save_tie_margin(calibrated(settings(database_url, tmp_path)))
        changed = settings(database_url, tmp_path, draft_tokens=8)
        source = tie_margin_for(store, changed, DEFAULT_ARM, changed.gates, T0)
        config = Evidence(tie_margin=source).judged_config(changed.gates)
        assert source.origin == "configured" and config.quality.tie_margin_nats == 0.5

    def test_a_margin_expires_after_its_max_age(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """30 days by default (`tie_margin_max_age_days`): at the expiry the configured
        margin judges again, and the detail names the calibration and why."""
        s = settings(database_url, tmp_path)
        store.save_tie_margin(calibrated(s))
        day_29 = tie_margin_for(store, s, DEFAULT_ARM, s.gates, T0 + timedelta(days=29.9))
        assert day_29.origin == "calibrated"
        day_30 = tie_margin_for(store, s, DEFAULT_ARM, s.gates, T0 + timedelta(days=30))
        assert day_30.origin == "configured" and day_30.margin == 0.5
        assert day_30.describe() == (
            "tie margin 0.5 nats (configured: gates.quality.tie_margin_nats); the calibration "
            "of 2026-03-02T10:30:00+00:00 does not judge: it expired at "
            "2026-04-01T10:30:00+00:00 (gates.quality.tie_margin_max_age_days = 30); run "
            "canaryd calibrate again"
        )
        shorter = s.gates.model_copy(
            update={"quality": s.gates.quality.model_copy(update={"tie_margin_max_age_days": 1.0})}
        )
        assert tie_margin_for(store, s, DEFAULT_ARM, shorter, T0 + timedelta(days=2)).not_applied

    def test_other_engines_read_the_configured_margin(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """Pairs from engines other than the calibrated ones (another torch under an
        in-process engine, another device): the margin does not judge them."""
        s = settings(database_url, tmp_path)
        measured_on = engines_key({"kind": "transformers"}, {}, {"torch": "2.5.1"})
        store.save_tie_margin(calibrated(s, engines=measured_on))
        now = T0 + timedelta(days=1)
        same = tie_margin_for(store, s, DEFAULT_ARM, s.gates, now, measured_on)
        assert same.origin == "calibrated"
        upgraded = engines_key({"kind": "transformers"}, {}, {"torch": "2.6.0"})
        assert upgraded != measured_on
        source = tie_margin_for(store, s, DEFAULT_ARM, s.gates, now, upgraded)
        assert source.origin == "configured"
        assert "are not the ones it was measured on" in source.describe()

    def test_a_row_from_before_the_aa_only_rule_does_not_judge(
        self, store: SqlStore, database_url: str, tmp_path: Path
    ) -> None:
        """A margin stored when A/B divergences were pooled into the bound (no A/A pair
        count, no engines): the arm under test set it, so it never judges."""
        s = settings(database_url, tmp_path)
        old = replace(calibrated(s), aa_arm=None, aa_divergent_pairs=None, engines=None)
        store.save_tie_margin(old)
        source = tie_margin_for(store, s, DEFAULT_ARM, s.gates, T0 + timedelta(days=1))
        assert source.origin == "configured"
        assert "before the margin came from A/A divergences alone" in source.describe()


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
        source = tie_margin_for(store, s, DEFAULT_ARM, s.gates, T0)
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
            store.save_tie_margin(calibrated(s, at=T0))
            gates.evaluate(now + timedelta(seconds=1))
            stale = store.latest_evaluation()
            store.save_tie_margin(calibrated(s, at=start))
            gates.evaluate(now + timedelta(seconds=2))
            after = store.latest_evaluation()
        finally:
            gates.close()
        assert before is not None and after is not None
        assert component(before.decisions, "quality.mismatch").state is not GateState.FAIL
        quality = next(d for d in before.decisions if d.name == "quality")
        assert "tie margin 0.5 nats (configured" in quality.detail
        assert stale is not None
        assert component(stale.decisions, "quality.mismatch").state is not GateState.FAIL
        quality = next(d for d in stale.decisions if d.name == "quality")
        assert "the calibration of 2026-03-02T10:30:00+00:00 does not judge: it expired" in (
            quality.detail
        )
        assert component(after.decisions, "quality.mismatch").state is GateState.FAIL
        quality = next(d for d in after.decisions if d.name == "quality")
        at = start.isoformat(timespec="seconds")
        assert f"tie margin 0.2 nats (calibrated at {at} from 240 divergent A/A" in quality.detail


def calibration(aa: list[Measured], ab: list[Measured] | None = None) -> Calibration:
    """A calibration of these measured pairs (the A/B run empty unless given)."""
    return Calibration(
        arm=DEFAULT_ARM,
        arms="key",
        engines=ENGINES,
        aa=RunDivergences.of("baseline", aa),
        ab=RunDivergences.of(DEFAULT_ARM, ab or []),
        prompts=len(aa),
        failures=0,
        at=T0,
    )


class TestOnlyTheAAPairsSetTheMargin:
    def test_a_deterministic_baseline_stores_nothing_whatever_the_arm_does(self) -> None:
        """The baseline reproduces itself on every prompt; the arm takes the runner-up of
        close calls on 300 prompts (margins up to 0.5 nats): nothing is stored, and the
        reason says why (the A/B run would have bounded the bug's own margins)."""
        rng = random.Random(3)
        bug = [Measured(tuple(rng.uniform(0.0, 0.5) for _ in range(6))) for _ in range(300)]
        result = calibration([Measured()] * 300, bug)
        assert result.ab.divergent_pairs == 300 and result.aa.divergent_pairs == 0
        assert result.bound is None and result.stored() is None
        assert result.why_not_stored() == (
            "0 of 300 A/A pairs (the baseline against itself) diverged with a measured margin, "
            "119 needed: the baseline reproduced itself on every prompt, so the deployment "
            "shows no numeric noise to bound (the A/B run never sets the margin)"
        )

    def test_the_bound_is_the_aa_pairs_and_ignores_the_ab_run(self) -> None:
        """150 divergent A/A pairs, margins 0.001 … 0.150 (one per pair, the largest of
        its tokens): the bound is their order statistic whatever the A/B run holds, and
        the row says what it rests on."""
        aa = [Measured((i / 1000, i / 2000)) for i in range(1, 151)]
        quiet = calibration(aa)
        loud = calibration(aa, [Measured((5.0,)) for _ in range(500)])
        assert quiet.bound == loud.bound == tail_bound([i / 1000 for i in range(1, 151)])
        row = loud.stored()
        assert row is not None and row.margin == loud.bound
        assert (row.aa_arm, row.aa_divergent_pairs, row.engines) == ("baseline", 150, ENGINES)
        assert (row.aa, row.ab, row.divergences) == (300, 500, 800)
        assert loud.why_not_stored() is None

    def test_fewer_than_119_divergent_pairs_store_nothing_however_many_tokens(self) -> None:
        """118 divergent pairs of 20 tokens each: 2,360 margins, 118 independent ones."""
        aa = [Measured(tuple(0.01 * (j + 1) for j in range(20))) for _ in range(118)]
        result = calibration([*aa, *[Measured()] * 82])
        assert len(result.aa.token_margins) == 2_360 and result.aa.divergent_pairs == 118
        assert result.bound is None
        assert (result.why_not_stored() or "").startswith(
            "118 of 200 A/A pairs (the baseline against itself) diverged"
        )


# The clustered margins of the coverage test: each divergent pair has its own scale (how
# close its prompt's calls are: log-normal, median 0.05 nats, σ 1.5) and 1 + Poisson(9)
# divergent tokens, each scale × Exp(1).
SCALE_MEDIAN, SCALE_SIGMA, EXTRA_TOKENS = 0.05, 1.5, 9.0


def clustered_pair(rng: random.Random) -> tuple[float, ...]:
    scale = SCALE_MEDIAN * math.exp(rng.gauss(0.0, SCALE_SIGMA))
    tokens = 1
    threshold, product = math.exp(-EXTRA_TOKENS), rng.random()
    while product > threshold:  # Knuth's Poisson draw
        tokens += 1
        product *= rng.random()
    return tuple(scale * rng.expovariate(1.0) for _ in range(tokens))


def true_quantile(cdf: Callable[[float], float], q: float = 0.975) -> float:
    low, high = 0.0, 100.0
    for _ in range(80):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < q else (low, middle)
    return high


@functools.cache
def _hermite_nodes() -> tuple[tuple[float, ...], tuple[float, ...]]:
    import numpy as np

    nodes, weights = np.polynomial.hermite_e.hermegauss(120)
    scales = SCALE_MEDIAN * np.exp(SCALE_SIGMA * nodes)
    return tuple(scales.tolist()), tuple((weights / math.sqrt(2 * math.pi)).tolist())


def scale_expectation(f: Callable[[float], float]) -> float:
    """E[f(scale)] over the log-normal scale (Gauss–Hermite, 120 nodes)."""
    scales, weights = _hermite_nodes()
    return sum(w * f(scale) for w, scale in zip(weights, scales, strict=True))


def pair_cdf(m: float) -> float:
    """P(a pair's largest margin ≤ m): E[x^K] = x·exp(λ(x − 1)), x = 1 − e^(−m/scale)."""

    def given(scale: float) -> float:
        x = -math.expm1(-m / scale)
        return x * math.exp(EXTRA_TOKENS * (x - 1.0))

    return scale_expectation(given)


def token_cdf(m: float) -> float:
    """P(a divergent token's margin ≤ m), tokens pooled (K is independent of the scale)."""
    return scale_expectation(lambda scale: -math.expm1(-m / scale))


class TestTheBoundCoversOnClusteredMargins:
    @pytest.mark.parametrize("pairs", [119, 200, 400])
    def test_at_least_93_percent_of_400_seeded_samples_cover(self, pairs: int) -> None:
        """400 seeded calibrations of `pairs` divergent A/A pairs with clustered token
        margins: the stored margin is at or above the true 97.5 % quantile of the pair
        margin (what the gate compares) in at least 93 % of them (95 % claimed; 400
        samples leave about 1 % of noise). Tokens pooled as one sample, the same data's
        bound covers the tokens' own 97.5 % quantile far less often: the clustering the
        per-pair bound is there for."""
        target, token_target = true_quantile(pair_cdf), true_quantile(token_cdf)
        rng = random.Random(pairs)
        covered = pooled_covered = 0
        for _ in range(400):
            measured = [Measured(clustered_pair(rng)) for _ in range(pairs)]
            bound = calibration(measured).bound
            assert bound is not None
            covered += bound >= target
            pooled = tail_bound([m for one in measured for m in one.margins])
            pooled_covered += pooled is not None and pooled >= token_target
        assert covered / 400 >= 0.93, covered
        assert pooled_covered / 400 < 0.9, pooled_covered


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
        from canaryd.judging.calibration import calibrate

        result = calibrate(Settings(), engines, DEFAULT_ARM, [prompt(i) for i in range(20)])
        assert result.aa.pairs == result.ab.pairs == 20 and result.failures == 0
        assert result.aa.pair_margins == () and result.aa.token_margins == ()
        assert result.ab.pair_margins, "near-uniform logits with noise should diverge somewhere"
        tokens = result.ab.token_margins
        assert all(0.0 < m <= 0.8 + 1e-4 for m in tokens), tokens
        assert result.ab.max_margin == pytest.approx(max(tokens))
        assert result.needed == 119
        assert result.bound is None and result.stored() is None
        assert "the baseline reproduced itself on every prompt" in (result.why_not_stored() or "")
