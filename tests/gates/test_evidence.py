"""gates.evidence: the one value a judgement reads, and the tie margin that comes with it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gates import GatesConfig, SwitchState
from gates.cycle import judge
from gates.evidence import Evidence, MarginSource, with_tie_margin
from gates.pairs.testing import T0, at, record, scores
from gates.switch.policy import CategorySwitch

CALIBRATED = MarginSource(0.2, "calibrated", T0, 240, "baseline", T0 + timedelta(days=30))
CONFIGURED = MarginSource(0.5, "configured")


class TestMarginSource:
    def test_each_origin_says_where_the_margin_came_from(self) -> None:
        """A configured margin names its key; a calibrated one its time, the divergent A/A
        pairs it rests on, what the baseline ran against, and when it expires."""
        assert CONFIGURED.describe() == (
            "tie margin 0.5 nats (configured: gates.quality.tie_margin_nats)"
        )
        assert CALIBRATED.describe() == (
            "tie margin 0.2 nats (calibrated at 2025-01-01T00:00:00+00:00 from 240 divergent "
            "A/A pairs, the baseline against itself, until 2025-01-31T00:00:00+00:00)"
        )
        control = MarginSource(0.2, "calibrated", T0, 150, "replica")
        assert "150 divergent A/A pairs, the baseline against arm replica)" in control.describe()

    def test_a_calibration_that_does_not_judge_says_why(self) -> None:
        """A stored margin that no longer applies leaves the configured one judging, and
        the detail names the calibration and the reason."""
        stale = MarginSource(0.5, "configured", T0, not_applied="it expired at 2025-01-31")
        assert stale.describe() == (
            "tie margin 0.5 nats (configured: gates.quality.tie_margin_nats); the "
            "calibration of 2025-01-01T00:00:00+00:00 does not judge: it expired at 2025-01-31"
        )

    def test_only_the_quality_decision_names_it(self) -> None:
        """The note goes after the quality decision's detail; other decisions are untouched."""
        decisions = judge(Evidence([record(i) for i in range(20)]), GatesConfig(), at(19))
        noted = CALIBRATED.note(decisions.decisions)
        for before, after in zip(decisions.decisions, noted, strict=True):
            if before.name == "quality":
                assert after.detail == f"{before.detail}; {CALIBRATED.describe()}"
            else:
                assert after == before

    def test_with_tie_margin_copies_the_config(self) -> None:
        """The copy judges ties within the margin; the operator's config is not touched."""
        config = GatesConfig()
        copied = with_tie_margin(config, 0.2)
        assert copied.quality.tie_margin_nats == 0.2
        assert config.quality.tie_margin_nats == 0.5


class TestEvidence:
    def test_the_switch_state_starts_the_evidence_unless_a_since_does(self) -> None:
        """The state's last transition and its categories' own moves start the evidence;
        an explicit `since` (a revision's window) replaces both."""
        moved = CategorySwitch(since=at(50))
        state = SwitchState(since=at(10), categories=(("math", moved),))
        assert Evidence(state=state).start == at(10)
        assert Evidence(state=state).category_since == {"math": at(50)}
        assert Evidence(state=state, since=at(90)).start == at(90)
        assert Evidence(state=state, since=at(90)).category_since is None
        assert Evidence().start is None and Evidence().category_since is None

    def test_telemetry_needs_its_scrape_interval(self) -> None:
        """The scrape interval is the telemetry budget's unit: evidence without it is refused."""
        from gates.telemetry.intervals import TelemetryEvidence

        with pytest.raises(ValueError, match="scrape_interval_s"):
            Evidence(telemetry=TelemetryEvidence())

    def test_the_judged_config_carries_the_calibrated_margin_and_the_rate(self) -> None:
        """A calibrated margin is copied in, a configured one leaves the config as it is,
        and a pair rate twice the design rate re-budgets the copy."""
        config = GatesConfig()
        assert Evidence(tie_margin=CONFIGURED).judged_config(config) is config
        calibrated = Evidence(tie_margin=CALIBRATED).judged_config(config)
        assert calibrated.quality.tie_margin_nats == 0.2
        rated = Evidence(pair_rate=12.0).judged_config(config)
        assert rated.budget != config.budget and rated.quality == config.quality

    def test_judge_names_the_margin_but_the_reason_quotes_the_bare_detail(self) -> None:
        """The tie margin is noted on the quality decision after the verdict's reason was
        written: a quality FAIL's reason quotes its detail without the margin."""
        only_quality = GatesConfig.model_validate(
            {name: {"mode": "dry_run"} for name in ("liveness", "error", "latency", "drift")}
            | {"speedup": {"mode": "dry_run"}, "quality": {"min_samples": 20}}
        )
        # One pair in five diverges 0.3 nats: a tie under the configured 0.5, real under 0.2.
        records = [
            record(i, pair_scores=scores(exact=i % 5 != 0, margin=None if i % 5 else 0.3))
            for i in range(200)
        ]
        bare = judge(Evidence(records), only_quality, at(199))
        noted = judge(Evidence(records, tie_margin=CALIBRATED), only_quality, at(199))
        assert noted.verdict == "FAIL" and noted.reason.startswith("quality FAILed")
        quality = next(d for d in noted.decisions if d.name == "quality")
        assert quality.detail.endswith(CALIBRATED.describe())
        assert CALIBRATED.describe() not in noted.reason
        assert bare.verdict != "FAIL"
