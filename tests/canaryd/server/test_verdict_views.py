"""What a rollout tool reads besides the verdict: the `estimate` of every body, the compact
view for Argo's measurement history (under 1 KB whatever the revision and reason),
Flagger's `confirm-traffic-increase` hook, and the rollout burst each writing request names
— over real HTTP on loopback, judged from a real SQLite store of fake-engine pairs."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from canaryd.judging.verdict import COMPACT_MAX_BYTES, RevisionVerdict, VerdictQuery
from canaryd.server.rollout import _flagger_yes
from tests.canaryd.server.test_rollout import World
from tests.canaryd.server.test_rollout import world as world  # the fixture

# The longest revision there is, of the characters JSON escapes (two bytes each).
WORST_REVISION = '"\\' * 64


class Recorder:
    """A `Burst` that records what it is told and reports a fixed cost."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []

    def named(self, query: VerdictQuery, verdict: RevisionVerdict | None) -> None:
        self.calls.append((query.revision, None if verdict is None else verdict.verdict))

    def report(self, revision: str) -> dict[str, Any] | None:
        return {"active": True, "pairs": 3, "tokens": {"baseline": 30, "speculative": 30}}


def compact_size(body: dict[str, Any]) -> int:
    return len(json.dumps(body, sort_keys=True, allow_nan=False).encode())


def verdict(reason: str, revision: str = WORST_REVISION, **fields: Any) -> RevisionVerdict:
    return RevisionVerdict(
        verdict=fields.pop("verdict", "INCONCLUSIVE"),
        fresh=fields.pop("fresh", True),
        evaluated_at=datetime(2026, 12, 1, tzinfo=UTC),
        age_s=1.0,
        revision=revision,
        pairs=fields.pop("pairs", 999_999),
        arms={},
        speculative_enabled=True,
        generation=7,
        reason=reason,
        pairs_per_minute=20.0,
        **fields,
    )


class TestCompactView:
    def test_a_decided_revision_in_under_1_kb(self, world: World) -> None:
        """`view=compact` answers verdict, fresh, revision, pairs, speculative_enabled,
        failed_at, reason and estimate only; a FAIL and a PASS both fit in 1 KB, and the
        full body is larger."""
        world.open(revision="bad")
        world.pairs(10, error_rate=1.0)
        full = world.verdict(revision="bad").json()
        compact = world.verdict(revision="bad", view="compact")
        assert compact.status_code == 200
        body = compact.json()
        assert set(body) == {
            "verdict",
            "fresh",
            "revision",
            "pairs",
            "speculative_enabled",
            "failed_at",
            "reason",
            "estimate",
        }
        assert (body["verdict"], body["fresh"], body["pairs"]) == ("FAIL", True, 10)
        assert body["speculative_enabled"] is True  # no gate job here rolled it back
        assert body["failed_at"] == full["evaluated_at"]  # judged FAIL by this gate run
        assert body["estimate"]["pairs_to_decision"] == 0
        assert body["estimate"]["minutes_to_decision"] == 0.0
        assert len(compact.content) < COMPACT_MAX_BYTES < len(json.dumps(full))
        posted = world.client.post("/v1/verdict", params={"revision": "bad", "view": "compact"})
        assert posted.json() == body

    def test_the_worst_case_revision_through_http(self, world: World) -> None:
        """A 128-character revision of characters JSON escapes, named in the reason too,
        still answers under 1 KB."""
        world.open(revision=WORST_REVISION)
        world.pairs(10, error_rate=1.0)
        answer = world.verdict(revision=WORST_REVISION, view="compact")
        assert answer.status_code == 200, answer.text
        assert answer.json()["revision"] == WORST_REVISION
        assert len(answer.content) < COMPACT_MAX_BYTES

    @pytest.mark.parametrize(
        "reason",
        [
            "x" * 50_000,
            "é" * 50_000,  # six bytes each once JSON escapes it
            "\U0001f600" * 10_000,  # twelve (a surrogate pair)
            ", ".join(f"gate_{i} FAIL" for i in range(2000)),  # many decisions
        ],
    )
    def test_any_reason_fits(self, reason: str) -> None:
        """Whatever the reason's length and characters, the compact body is under 1 KB and
        keeps the reason's start."""
        body = verdict(reason).as_json("compact")
        assert compact_size(body) < COMPACT_MAX_BYTES
        kept = body["reason"].removesuffix("…")
        assert kept and reason.startswith(kept)
        assert body["revision"] == WORST_REVISION and body["pairs"] == 999_999

    @pytest.mark.parametrize(
        ("query", "says"),
        [
            ("?revision=a&view=tiny", "expected one of full, compact"),
            ("?revision=a&view=compact&format=kayenta", "leave out format=kayenta"),
            ("?revision=a&view=compact&view=full", "given 2 times"),
        ],
    )
    def test_bad_views_are_400(self, world: World, query: str, says: str) -> None:
        answer = world.client.get(f"/v1/verdict{query}")
        assert answer.status_code == 400
        assert answer.json()["key"] == "view" and says in answer.json()["reason"]


class TestEstimate:
    def test_the_pairs_and_minutes_a_revision_still_needs(self, world: World) -> None:
        """Liveness (the only enforce gate) needs 5 pairs: after 3 the estimate is 2 more
        pairs, 1 minute at the schedule's one pair per 30 s; once decided, none."""
        world.open(revision="r")
        world.pairs(3)
        undecided = world.verdict(revision="r").json()
        assert undecided["verdict"] in ("NODATA", "INCONCLUSIVE")
        assert undecided["estimate"] == {
            "pairs_to_decision": 2,
            "minutes_to_decision": 1.0,
            "waiting_on": "liveness",
        }
        assert (
            world.verdict(revision="r", view="compact").json()["estimate"]
            == (undecided["estimate"])
        )
        world.pairs(2)
        decided = world.verdict(revision="r").json()
        assert decided["verdict"] == "PASS"
        assert decided["estimate"] == {
            "pairs_to_decision": 0,
            "minutes_to_decision": 0.0,
            "waiting_on": None,
        }

    def test_no_rate_no_minutes(self) -> None:
        """Without a judgement or a pair rate the minutes are unknown (null), never 0."""
        assert verdict("r").estimate()["minutes_to_decision"] is None


class TestConfirmTrafficIncrease:
    def test_the_weight_holds_without_evidence_that_does_not_fail(self, world: World) -> None:
        """NODATA holds the weight (412), and so do liveness alone deciding (error, latency
        and quality still NODATA), a FAIL and a superseded revision; each answer carries
        the estimate and why the weight holds (`hold`)."""
        world.flagger("pre-rollout", "good")
        held = world.flagger("confirm-traffic-increase", "good")
        assert held.status_code == 412 and held.json()["verdict"] == "NODATA"
        assert set(held.json()["estimate"]) == {
            "pairs_to_decision",
            "minutes_to_decision",
            "waiting_on",
        }
        assert held.json()["hold"].startswith("nothing is decided yet")
        world.pairs(10)
        alive = world.flagger("confirm-traffic-increase", "good")
        assert (alive.status_code, alive.json()["verdict"]) == (412, "PASS")
        assert "error NODATA; latency NODATA; quality NODATA" in alive.json()["hold"]
        world.later()
        world.flagger("pre-rollout", "bad")
        world.pairs(10, error_rate=1.0)
        failed = world.flagger("confirm-traffic-increase", "bad")
        assert (failed.status_code, failed.json()["hold"]) == (412, "the revision FAILed")
        stale = world.flagger("confirm-traffic-increase", "good")
        assert stale.status_code == 412 and "not fresh" in stale.json()["hold"]

    @pytest.mark.parametrize(("hold", "yes"), [(None, True), ("error NODATA", False)])
    def test_the_rule(self, hold: str | None, yes: bool) -> None:
        """Yes exactly when nothing holds the weight (`canaryd.judging.increase`)."""
        answer = _flagger_yes("confirm-traffic-increase", verdict("r", verdict="PASS"), hold)
        assert answer is yes


class TestBurstNaming:
    def test_writes_and_hooks_name_the_revision_and_reads_do_not(self, tmp_path: Path) -> None:
        """POST /v1/verdict and every Flagger hook name their revision to the burst (the
        pre-rollout hook before any verdict); GET never does; every body carries the
        burst's report."""
        burst = Recorder()
        world = World(tmp_path, burst=burst)
        try:
            world.verdict(revision="a")
            assert burst.calls == []
            world.flagger("pre-rollout", "a")
            world.open(revision="a")
            world.flagger("confirm-traffic-increase", "a")
            world.flagger("rollback", "a")
            assert burst.calls == [("a", None), ("a", "NODATA"), ("a", "NODATA"), ("a", "NODATA")]
            body = world.verdict(revision="a").json()
            assert body["burst"] == burst.report("a")
            assert len(burst.calls) == 4
        finally:
            world.close()
