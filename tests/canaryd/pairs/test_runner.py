"""The pair runner over fake engines: one prompt to the baseline and every speculative arm
with the same request, a record per speculative arm sharing one baseline result, the
arm order drawn at random, and a raising engine contained on its own arm."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from canaryd.pairs.runner import PairParams, PairRunner, arm_seed
from engine.config import FakeEngineConfig
from engine.fake import FakeEngine
from engine.types import ErrorKind, GenerationRequest, GenerationResult, Message
from gates.records import Prompt


def prompt(n: int = 0) -> Prompt:
    text = f"summarise the canary report number {n} in a few words please, briefly"
    return Prompt(id=f"qa-{n}", category="qa", messages=(Message("user", text),), max_tokens=32)


def three_arms(seed: int = 0, **medusa: object) -> PairRunner:
    return PairRunner(
        FakeEngine(FakeEngineConfig(seed=1)),
        {
            "hydra": FakeEngine(FakeEngineConfig(speculative=True, acceptance_rate=0.9, seed=1)),
            "medusa": FakeEngine(
                FakeEngineConfig(speculative=True, acceptance_rate=0.4, seed=1, **medusa)
            ),
        },
        run_id="run",
        seed=seed,
    )


class Recording(FakeEngine):
    """A fake engine that keeps every request it was sent."""

    def __init__(self, config: FakeEngineConfig) -> None:
        super().__init__(config)
        self.requests: list[GenerationRequest] = []

    def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        return super().generate(request)


class Raising(FakeEngine):
    def generate(self, request: GenerationRequest) -> GenerationResult:
        raise RuntimeError("a bug in the engine")


class TestRunGroup:
    def test_a_record_per_speculative_arm_sharing_the_baseline(self) -> None:
        """Each speculative arm gets its own record, named by its arm, with its own pair
        id; all share the group id, the seed and the very baseline result."""
        group = three_arms().run_group(prompt())
        assert group.arms == ("hydra", "medusa")
        hydra, medusa = group.records
        assert (hydra.arm, medusa.arm) == ("hydra", "medusa")
        assert hydra.group_id == medusa.group_id == group.group_id
        assert len({hydra.pair_id, medusa.pair_id, group.group_id}) == 3
        assert hydra.baseline is medusa.baseline is group.baseline
        assert hydra.sampling_seed == medusa.sampling_seed
        assert sorted(group.order) == ["baseline", "hydra", "medusa"]
        assert group.record("medusa") is medusa
        with pytest.raises(KeyError):
            group.record("eagle")

    def test_every_arm_gets_the_same_request(self) -> None:
        """Prompt, sampling parameters, seed and request id are identical on every arm."""
        engines = {
            name: Recording(FakeEngineConfig(speculative=name != "baseline"))
            for name in ("baseline", "hydra", "medusa")
        }
        runner = PairRunner(
            engines["baseline"],
            {"hydra": engines["hydra"], "medusa": engines["medusa"]},
            run_id="r",
        )
        for n in range(3):
            runner.run_group(prompt(n))
        for n in range(3):
            sent = {name: engine.requests[n] for name, engine in engines.items()}
            assert len(set(sent.values())) == 1, sent

    def test_a_seed_per_arm_for_sampled_pairs(self) -> None:
        """With `seed_per_arm`, a sampled request carries the pair's seed on the baseline
        and its own on every other arm (a fixed function of the seed and the arm's name,
        so a stored pair replays); everything else is the same request. Greedy requests
        are untouched. The fake samples by seed: the arms' outputs differ, and drawn
        again from the stored seed, they repeat."""
        engines = {
            name: Recording(FakeEngineConfig(speculative=name != "baseline"))
            for name in ("baseline", "hydra", "medusa")
        }
        for temperature in (0.7, 0.0):
            runner = PairRunner(
                engines["baseline"],
                {"hydra": engines["hydra"], "medusa": engines["medusa"]},
                run_id="r",
                params=PairParams(temperature=temperature, seed_per_arm=True),
            )
            group = runner.run_group(prompt(1))
            sent = {name: engine.requests[-1] for name, engine in engines.items()}
            seed = group.records[0].sampling_seed
            assert sent["baseline"].sampling.seed == seed
            if temperature == 0.0:
                assert len(set(sent.values())) == 1
                continue
            for arm in ("hydra", "medusa"):
                assert sent[arm].sampling.seed == arm_seed(seed, arm) != seed
                assert replace(sent[arm].sampling, seed=seed) == sent["baseline"].sampling
                assert group.record(arm).speculative.text != group.baseline.text
            assert arm_seed(seed, "hydra") != arm_seed(seed, "medusa")
            replayed = FakeEngine(FakeEngineConfig(speculative=True)).generate(sent["hydra"])
            assert replayed.text == group.record("hydra").speculative.text

    def test_each_arm_is_scored_against_the_baseline(self) -> None:
        """An arm that corrupts its outputs scores no exact match; the other arm still does."""
        records = [three_arms(corrupt_rate=1.0).run_group(prompt(n)) for n in range(4)]
        for group in records:
            hydra, medusa = group.records
            assert hydra.scores is not None and hydra.scores.exact_match
            assert medusa.scores is not None and not medusa.scores.exact_match

    def test_arm_order_is_drawn_per_prompt(self) -> None:
        """Over many prompts every arm runs first sometimes; a seeded runner repeats it."""
        first = Counter(order[0] for order in _orders(5, 30))
        assert set(first) == {"baseline", "hydra", "medusa"}
        assert _orders(5, 8) == _orders(5, 8)
        assert _orders(5, 8) != _orders(6, 8)

    def test_two_arms_draw_seed_and_order_as_they_always_did(self) -> None:
        """A baseline and one speculative arm consume the seeded generator exactly as
        before arms had names (seed, then a coin for the order), and the record's pair id
        is its group id."""
        runner = PairRunner(
            FakeEngine(FakeEngineConfig()),
            FakeEngine(FakeEngineConfig(speculative=True)),
            run_id="r",
            seed=11,
        )
        expected = random.Random(11)
        for n in range(6):
            record = runner.run_pair(prompt(n))
            seed = expected.randrange(2**31)
            swapped = expected.random() < 0.5
            assert record.sampling_seed == seed
            assert record.arm_order == (
                ("speculative", "baseline") if swapped else ("baseline", "speculative")
            )
            assert record.arm == "speculative" and record.group_id == record.pair_id

    def test_run_pair_needs_one_arm(self) -> None:
        """`run_pair` on several arms says to use `run_group`."""
        with pytest.raises(ValueError, match="use run_group"):
            three_arms().run_pair(prompt())

    def test_no_arm_may_be_called_baseline(self) -> None:
        """The baseline is passed on its own; a speculative arm of that name is refused."""
        engine = FakeEngine(FakeEngineConfig())
        with pytest.raises(ValueError, match="none called 'baseline'"):
            PairRunner(engine, {"baseline": engine}, run_id="r")

    def test_a_raising_arm_fails_alone(self) -> None:
        """An engine that raises is an `internal` error on its arm; the others are scored."""
        runner = PairRunner(
            FakeEngine(FakeEngineConfig()),
            {
                "good": FakeEngine(FakeEngineConfig(speculative=True)),
                "broken": Raising(FakeEngineConfig(speculative=True)),
            },
            run_id="r",
        )
        good, broken = runner.run_group(prompt()).records
        assert good.complete and good.scores is not None
        assert broken.speculative.error is ErrorKind.INTERNAL and broken.scores is None
        assert "a bug in the engine" in broken.speculative.error_detail


def _orders(seed: int, n: int) -> list[tuple[str, ...]]:
    runner = three_arms(seed=seed)
    return [runner.run_group(prompt(i)).order for i in range(n)]
