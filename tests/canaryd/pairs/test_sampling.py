"""Stratified, weighted, seeded prompt sampling."""

from __future__ import annotations

from collections import Counter

import pytest

from canaryd.errors import UnknownCategoryError
from canaryd.pairs.sampler import StratifiedSampler
from engine.types import Message
from gates.records import Prompt


def prompts(spec: dict[str, int]) -> list[Prompt]:
    return [
        Prompt(id=f"{c}-{i}", category=c, messages=(Message("user", f"{c} {i}"),), max_tokens=8)
        for c, n in spec.items()
        for i in range(n)
    ]


class TestStratifiedSampler:
    def test_every_category_gets_its_share_in_each_window(self) -> None:
        """Equal weights: any 3 consecutive draws cover all 3 categories, however skewed."""
        sampler = StratifiedSampler(prompts({"a": 50, "b": 2, "c": 1}), seed=1)
        draws = [p.category for p in sampler.take(30)]
        for start in range(0, 30, 3):
            assert sorted(draws[start : start + 3]) == ["a", "b", "c"]

    def test_weights_set_proportions(self) -> None:
        """Weights 3:1 give exactly 75 % / 25 % over a multiple of the weight sum."""
        sampler = StratifiedSampler(prompts({"a": 5, "b": 5}), weights={"a": 3, "b": 1})
        assert Counter(p.category for p in sampler.take(400)) == {"a": 300, "b": 100}

    def test_zero_weight_excludes_a_category(self) -> None:
        """A weight of 0 switches a category off."""
        sampler = StratifiedSampler(prompts({"a": 3, "b": 3}), weights={"b": 0})
        assert {p.category for p in sampler.take(20)} == {"a"}

    def test_within_category_without_replacement(self) -> None:
        """Every prompt of a category is used once before any is used twice."""
        sampler = StratifiedSampler(prompts({"a": 7}), seed=3)
        first_pass = [p.id for p in sampler.take(7)]
        assert len(set(first_pass)) == 7

    def test_seeded_and_reproducible(self) -> None:
        """The same seed gives the same sequence; another seed a different one."""
        suite = prompts({"a": 10, "b": 10})
        one = [p.id for p in StratifiedSampler(suite, seed=4).take(20)]
        two = [p.id for p in StratifiedSampler(suite, seed=4).take(20)]
        three = [p.id for p in StratifiedSampler(suite, seed=5).take(20)]
        assert one == two != three

    def test_weight_for_unknown_category(self) -> None:
        """A weight naming a category with no prompts is an error listing the known ones."""
        with pytest.raises(UnknownCategoryError, match="known categories: a, b"):
            StratifiedSampler(prompts({"a": 1, "b": 1}), weights={"z": 1})
