"""A revision's verdict in Kayenta's judge-result shape (`GET /v1/verdict?format=kayenta`),
so that tools which display Kayenta results display canaryd's.

Kayenta's `CanaryJudgeResult` is `judgeName`, `results` (one `CanaryAnalysisResult` per
metric: `name`, `id`, `tags`, `classification` Pass/High/Low/Nodata/Error,
`classificationReason`, `groups`, `experimentMetadata`, `controlMetadata`, `resultMetadata`,
`critical`, `muted`), `groupScores` (`name`, `score`, `classification`,
`classificationReason`) and `score` (`score` 0–100, `classification` Pass/Marginal/Fail,
`classificationReason`). Each of canaryd's checks is a metric, grouped by its gate: PASS is
Pass; FAIL is High or Low by the side of the threshold its estimate lies on; WARN,
INCONCLUSIVE and NODATA are Nodata (undecided); a gate not in enforce mode is `muted`. A
group's score is the Pass share of its checks in percent (an undecided check counts against
it, as a metric without required data does in Kayenta); the summary score is 100 on PASS, 0
on FAIL (as Kayenta scores a critical failure), else the mean of the enforce gates' group
scores. The classification is canaryd's verdict: PASS is Pass, FAIL is Fail, and
INCONCLUSIVE and NODATA are Marginal, Kayenta's "not decided, keep going", whatever the
score.
"""

from __future__ import annotations

from typing import Any

from canaryd.judging.revision_verdict import RevisionVerdict, finite
from gates import GateDecision, GateState
from gates.core import checks

__all__ = ["JUDGE_NAME", "kayenta_result"]

JUDGE_NAME = "canaryd-v1"
_SCORE_CLASSIFICATION = {
    "PASS": "Pass",
    "FAIL": "Fail",
    "INCONCLUSIVE": "Marginal",
    "NODATA": "Marginal",
}


def _classification(check: GateDecision) -> str:
    if check.state is GateState.PASS:
        return "Pass"
    if check.state is not GateState.FAIL:
        return "Nodata"
    if check.estimate is not None and check.threshold is not None:
        return "High" if check.estimate > check.threshold else "Low"
    return "High"  # a FAIL without an estimate (no pairs at all, errors): too much of it


def _metric(gate: GateDecision, check: GateDecision) -> dict[str, Any]:
    return {
        "name": check.name,
        "id": check.name,
        "tags": {"category": check.category} if check.category else {},
        "classification": _classification(check),
        "classificationReason": f"{check.state.value}: {check.detail}",
        "groups": [gate.name],
        "experimentMetadata": {"n": check.n_speculative},
        "controlMetadata": {"n": check.n_baseline},
        "resultMetadata": {
            "state": check.state.value,
            "statistic": check.statistic,
            "ratio": check.estimate,
            "estimate": check.estimate,
            "lower": check.lower,
            "upper": check.upper,
            "threshold": check.threshold,
            "confidence": check.confidence,
            "detector": check.detector.to_dict() if check.detector else None,
        },
        "critical": gate.critical,
        "muted": not gate.enforced,
    }


def _group_score(results: list[dict[str, Any]]) -> float:
    """The Pass share of `results`, in percent (0 for none)."""
    if not results:
        return 0.0
    passed = sum(1 for r in results if r["classification"] == "Pass")
    return 100.0 * passed / len(results)


def kayenta_result(verdict: RevisionVerdict) -> dict[str, Any]:
    """`verdict` as Kayenta's `CanaryJudgeResult` (no non-finite number: null)."""
    results: list[dict[str, Any]] = []
    group_scores: list[dict[str, Any]] = []
    summary: list[float] = []
    for gate in verdict.gates:
        own = [_metric(gate, check) for check in checks([gate])]
        results.extend(own)
        score = round(_group_score(own), 2)
        group_scores.append(
            {"name": gate.name, "score": score, "classification": "", "classificationReason": ""}
        )
        if gate.enforced:
            summary.append(score)
    if verdict.verdict == "PASS":
        total = 100.0
    elif verdict.verdict == "FAIL" or not summary:
        total = 0.0
    else:
        total = round(sum(summary) / len(summary), 2)
    body = {
        "judgeName": JUDGE_NAME,
        "results": results,
        "groupScores": group_scores,
        "score": {
            "score": total,
            "classification": _SCORE_CLASSIFICATION[verdict.verdict],
            "classificationReason": verdict.reason,
        },
    }
    cleaned: dict[str, Any] = finite(body)
    return cleaned
