"""A verdict in Kayenta's judge-result shape (`canaryd.judging.kayenta`): the fields Kayenta's
`CanaryJudgeResult`, `CanaryAnalysisResult`, `CanaryJudgeGroupScore` and
`CanaryJudgeScore` carry, Kayenta's labels, and the same answer over HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from canaryd.judging.kayenta import JUDGE_NAME, kayenta_result
from canaryd.judging.verdict import RevisionVerdict
from gates import GateDecision, GateMode, GateState
from gates.cycle import Verdict
from tests.canaryd.server.test_rollout import World, never_finite

AT = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
# Kayenta's field names (kayenta-core canary/results/*.java).
RESULT_FIELDS = {
    "name",
    "id",
    "tags",
    "classification",
    "classificationReason",
    "groups",
    "experimentMetadata",
    "controlMetadata",
    "resultMetadata",
    "critical",
    "muted",
}


def check(
    name: str,
    state: GateState,
    *,
    estimate: float | None = None,
    threshold: float | None = None,
    category: str | None = None,
) -> GateDecision:
    return GateDecision(
        name=name,
        state=state,
        mode=GateMode.ENFORCE,
        critical=False,
        evaluated_at=AT,
        estimate=estimate,
        threshold=threshold,
        n_baseline=40,
        n_speculative=38,
        category=category,
        detail=f"{name} detail",
    )


def gate(
    name: str,
    *components: GateDecision,
    mode: GateMode = GateMode.ENFORCE,
    critical: bool = False,
) -> GateDecision:
    states = {c.state for c in components}
    if GateState.FAIL in states:
        state = GateState.FAIL
    else:
        state = GateState.PASS if states == {GateState.PASS} else GateState.INCONCLUSIVE
    return GateDecision(
        name=name,
        state=state,
        mode=mode,
        critical=critical,
        evaluated_at=AT,
        components=components,
    )


def verdict(outcome: Verdict, *gates: GateDecision) -> RevisionVerdict:
    return RevisionVerdict(
        verdict=outcome,
        fresh=True,
        evaluated_at=AT,
        age_s=1.0,
        revision="abc",
        pairs=40,
        arms={},
        speculative_enabled=True,
        generation=0,
        reason=f"the reason for {outcome}",
        gates=gates,
    )


class TestKayentaResult:
    def test_a_fail_is_high_or_low_scores_zero_and_classifies_fail(self) -> None:
        """A FAIL check above its threshold is High, below it Low; the result scores 0,
        classified Fail with the verdict's reason; every result has Kayenta's fields."""
        result = kayenta_result(
            verdict(
                "FAIL",
                gate(
                    "latency",
                    check("latency.e2e_p99", GateState.FAIL, estimate=1.6, threshold=1.2),
                    check("latency.ttft_p50", GateState.PASS, estimate=1.0, threshold=1.2),
                    critical=True,
                ),
                gate(
                    "speedup",
                    check("speedup.qa", GateState.FAIL, estimate=0.8, threshold=1.0, category="qa"),
                ),
            )
        )
        assert set(result) == {"judgeName", "results", "groupScores", "score"}
        assert result["judgeName"] == JUDGE_NAME
        assert result["score"] == {
            "score": 0.0,
            "classification": "Fail",
            "classificationReason": "the reason for FAIL",
        }
        by_name = {r["name"]: r for r in result["results"]}
        assert {name: r["classification"] for name, r in by_name.items()} == {
            "latency.e2e_p99": "High",
            "latency.ttft_p50": "Pass",
            "speedup.qa": "Low",
        }
        for found in result["results"]:
            assert set(found) == RESULT_FIELDS
        p99 = by_name["latency.e2e_p99"]
        assert p99["groups"] == ["latency"] and p99["critical"] is True and not p99["muted"]
        assert p99["controlMetadata"] == {"n": 40} and p99["experimentMetadata"] == {"n": 38}
        assert p99["resultMetadata"]["ratio"] == 1.6
        assert by_name["speedup.qa"]["tags"] == {"category": "qa"}
        assert {g["name"]: g["score"] for g in result["groupScores"]} == {
            "latency": 50.0,
            "speedup": 0.0,
        }

    def test_undecided_checks_are_nodata_and_the_verdict_marginal(self) -> None:
        """WARN, INCONCLUSIVE and NODATA checks are Nodata and count against their group;
        an INCONCLUSIVE verdict is Marginal with the mean of the enforce groups' scores; a
        gate in warn mode is muted and left out of the score."""
        result = kayenta_result(
            verdict(
                "INCONCLUSIVE",
                gate("error", check("error.paired", GateState.PASS)),
                gate(
                    "quality",
                    check("quality.mismatch", GateState.PASS),
                    check("quality.task", GateState.INCONCLUSIVE),
                    check("quality.loops", GateState.WARN),
                    check("quality.nll", GateState.NODATA),
                ),
                gate("drift", check("drift.qa", GateState.FAIL), mode=GateMode.WARN),
            )
        )
        labels = {r["name"]: r["classification"] for r in result["results"]}
        assert labels["quality.task"] == labels["quality.loops"] == labels["quality.nll"]
        assert labels["quality.nll"] == "Nodata"
        assert {r["name"]: r["muted"] for r in result["results"]}["drift.qa"] is True
        assert result["score"]["classification"] == "Marginal"
        assert result["score"]["score"] == (100.0 + 25.0) / 2

    def test_a_pass_scores_100_and_nothing_is_non_finite(self) -> None:
        """A PASS is 100, Pass; an infinite estimate is null."""
        result = kayenta_result(
            verdict(
                "PASS",
                gate("speedup", check("speedup.all", GateState.PASS, estimate=float("inf"))),
            )
        )
        assert result["score"]["score"] == 100.0
        assert result["score"]["classification"] == "Pass"
        assert result["results"][0]["resultMetadata"]["estimate"] is None
        json.dumps(result, allow_nan=False)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    made = World(tmp_path)
    yield made
    made.close()


class TestOverHttp:
    def test_format_kayenta_serves_the_same_verdict(self, world: World) -> None:
        """`format=kayenta` answers the revision's verdict in Kayenta's shape: a failing
        revision is Fail with a High liveness result."""
        world.open(revision="bad")
        world.pairs(10, error_rate=1.0)
        answer = world.verdict(revision="bad", format="kayenta")
        assert answer.status_code == 200
        body: dict[str, Any] = json.loads(answer.text, parse_constant=never_finite)
        assert body["score"]["classification"] == "Fail" and body["score"]["score"] == 0.0
        assert "liveness FAILed" in body["score"]["classificationReason"]
        liveness = [r for r in body["results"] if r["groups"] == ["liveness"]]
        assert liveness and liveness[0]["classification"] == "High"
        assert liveness[0]["critical"] is True
