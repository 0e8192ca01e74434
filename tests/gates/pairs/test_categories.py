"""Per-category speedup and quality checks (`scope = "category"`): each category judged on
its own pairs with its share of the detector's false-alarm budget, and `evaluate_all`
restarting a category's evidence where it last moved."""

from __future__ import annotations

import math

from gates import GatesConfig, GateState, evaluate_all, quality_gate, speedup_gate
from gates.config import QualityGateConfig, SpeedupGateConfig
from gates.pairs.categories import category_arl0, combine_categories, group_by_category
from gates.pairs.testing import at, record, result, scores
from gates.records import PairRecord
from gates.stats.budget import DEFAULT_ARL0, detector_arl0
from gates.stats.sequential import lorden_threshold
from gates.window import select

CATEGORIES = ("code", "math", "qa")


def mixed(n_per_category: int, slow: str | None = None, *, start: int = 0) -> list[PairRecord]:
    """Pairs cycling through the categories; the speculative arm takes 0.5 s (2× faster)
    except in `slow`, where it takes 2 s (2× slower)."""
    records = []
    for index in range(n_per_category * len(CATEGORIES)):
        category = CATEGORIES[index % len(CATEGORIES)]
        e2e = 2.0 if category == slow else 0.5
        records.append(record(start + index, speculative=result(e2e), category=category))
    return records


class TestBudgetSplit:
    def test_category_shares_add_up_to_the_detectors_rate(self) -> None:
        """Per pair of all traffic, the categories' false-alarm rates sum to 1 / ARL0."""
        counts = {"code": 10, "math": 30, "qa": 60}
        total = sum(counts.values())
        arl0 = 1e6
        rate = sum((n / total) / category_arl0(counts, c, arl0) for c, n in counts.items())
        assert math.isclose(rate, 1 / arl0)
        assert category_arl0(counts, "qa", arl0) > category_arl0(counts, "code", arl0)

    def test_an_unknown_or_empty_category_keeps_the_whole_share(self) -> None:
        assert category_arl0({}, "math", 50.0) == 50.0
        assert category_arl0({"code": 3}, "math", 0.5) == 1.0

    def test_group_by_category_keeps_order_and_drops_none(self) -> None:
        records = mixed(2)
        grouped = group_by_category(records, lambda r: r.pair_id if r.pair_id != "p0" else None)
        assert grouped == {"code": ["p3"], "math": ["p1", "p4"], "qa": ["p2", "p5"]}


class TestSpeedupByCategory:
    config = SpeedupGateConfig(min_samples=20)

    def test_the_slow_category_fails_alone(self) -> None:
        records = mixed(100, slow="math")
        decision = speedup_gate(
            records, self.config, now=at(len(records)), by_category=True, arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.FAIL and decision.categories == ("math",)
        states = {c.category: c.state for c in decision.components}
        assert states == {"code": GateState.PASS, "math": GateState.FAIL, "qa": GateState.PASS}
        assert [c.name for c in decision.components] == [
            "speedup.code",
            "speedup.math",
            "speedup.qa",
        ]

    def test_the_pooled_gate_does_not_see_one_slow_category(self) -> None:
        """The reason for the scope: a third of the pairs 2× slower keeps the pooled median
        above 1, so the global gate PASSes while math loses."""
        records = mixed(60, slow="math")
        pooled = speedup_gate(records, self.config, now=at(len(records)), arl0=DEFAULT_ARL0)
        assert pooled.state is GateState.PASS and pooled.components == ()
        assert pooled.category is None

    def test_each_category_uses_its_share_of_the_budget(self) -> None:
        records = mixed(30, slow="math")
        arl0 = 1e4
        decision = speedup_gate(
            records, self.config, now=at(len(records)), arl0=arl0, by_category=True
        )
        counts = {c: 30 for c in CATEGORIES}
        h = lorden_threshold(category_arl0(counts, "math", arl0))
        (math_check,) = [c for c in decision.components if c.category == "math"]
        assert f"vs h {h:.2f}" in math_check.detail and math_check.detail.startswith("math: ")

    def test_a_thin_category_is_nodata_and_keeps_the_gate_from_passing(self) -> None:
        records = [*mixed(30), record(999, speculative=result(0.5), category="rare")]
        decision = speedup_gate(
            records, self.config, now=at(1000), by_category=True, arl0=DEFAULT_ARL0
        )
        rare = [c for c in decision.components if c.category == "rare"]
        assert rare[0].state is GateState.NODATA
        assert decision.state is GateState.INCONCLUSIVE

    def test_no_pairs_is_nodata(self) -> None:
        decision = speedup_gate([], self.config, now=at(0), by_category=True, arl0=DEFAULT_ARL0)
        assert decision.state is GateState.NODATA and decision.components == ()


class TestQualityByCategory:
    config = QualityGateConfig(min_samples=20)

    def records(self, bad: str) -> list[PairRecord]:
        """Greedy pairs; every output in `bad` differs from the baseline's."""
        return [
            record(i, category=c, pair_scores=scores(exact=c != bad))
            for i in range(90)
            for c in (CATEGORIES[i % 3],)
        ]

    def test_mismatches_in_one_category_fail_it_alone(self) -> None:
        records = self.records("math")
        decision = quality_gate(
            records, self.config, now=at(90), by_category=True, arl0=DEFAULT_ARL0
        )
        assert decision.state is GateState.FAIL and decision.categories == ("math",)
        by = {c.category: c for c in decision.components}
        assert by["math"].state is GateState.FAIL
        assert {by["code"].state, by["qa"].state} == {GateState.INCONCLUSIVE}  # 30 pairs each
        checks = [c.name for c in by["math"].components]
        assert checks == [
            "quality.math.mismatch",
            "quality.math.ties",
            "quality.math.score",
            "quality.math.loops",
        ]
        assert "math: distribution: no sampled pair" in by["math"].detail

    def test_the_global_gate_keeps_its_checks(self) -> None:
        decision = quality_gate(self.records("math"), self.config, now=at(90), arl0=DEFAULT_ARL0)
        assert [c.name for c in decision.components] == [
            "quality.mismatch",
            "quality.ties",
            "quality.score",
            "quality.loops",
        ]
        assert all(c.category is None for c in decision.components)

    def test_combine_names_only_the_categories_in_the_worst_state(self) -> None:
        records = self.records("math")
        decision = quality_gate(
            records, self.config, now=at(90), by_category=True, arl0=DEFAULT_ARL0
        )
        again = combine_categories(
            "quality", self.config, select(records, self.config, at(90)), at(90),
            decision.components,
        )  # fmt: skip
        assert again.categories == ("math",) and again.state is GateState.FAIL


class TestEvaluateAllByCategory:
    def config(self, scope: str) -> GatesConfig:
        quick = {"min_samples": 20}
        return GatesConfig(
            speedup=quick, quality=quick, policy={"scope": scope}, error={"min_samples": 20}
        )

    def test_category_scope_judges_speedup_and_quality_per_category(self) -> None:
        records = mixed(100, slow="math")
        decisions = {d.name: d for d in evaluate_all(records, self.config("category"), now=at(300))}
        assert decisions["speedup"].categories == ("math",)
        assert all(c.category for c in decisions["quality"].components)
        assert decisions["latency"].category is None  # all traffic, always
        global_ = {d.name: d for d in evaluate_all(records, self.config("global"), now=at(300))}
        assert global_["speedup"].components == ()

    def test_a_categorys_evidence_restarts_where_it_last_moved(self) -> None:
        """Math was slow, then moved at pair 180 and is fast since: its own checks read only
        the pairs after the move, the gates on all traffic read every pair."""
        records = [*mixed(60, slow="math"), *mixed(60, start=180)]
        config = self.config("category")
        now = at(360)
        before = {d.name: d for d in evaluate_all(records, config, now=now)}
        math_check = next(c for c in before["speedup"].components if c.category == "math")
        assert math_check.state is not GateState.PASS
        after = {
            d.name: d
            for d in evaluate_all(records, config, now=now, category_since={"math": at(179)})
        }
        math_check = next(c for c in after["speedup"].components if c.category == "math")
        assert math_check.state is GateState.PASS and math_check.n_speculative == 60
        settled = 360 - config.error.settle_pairs  # the newest pairs are not yet judged
        assert after["error"].n_baseline == before["error"].n_baseline == settled

    def test_the_budget_is_unchanged_by_the_scope(self) -> None:
        assert detector_arl0(self.config("category")) == detector_arl0(self.config("global"))
