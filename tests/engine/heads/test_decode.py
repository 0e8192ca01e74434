"""`method = "draft_heads"` in the transformers engine, on tiny models built in code."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from canaryd.pairs.suites import load_default_suites
from engine.config import SpeculativeConfig, TransformersEngineConfig
from engine.errors import EngineConfigError, HeadsNotTrainedError
from engine.heads.data import DataPlan, SeedPrompt
from engine.heads.model import DraftHeads, HeadKind, initialised_heads, load_heads
from engine.heads.train import TrainPlan, train_heads
from engine.hf import TransformersEngine
from engine.types import ErrorKind, GenerationRequest, GenerationResult, Message, SamplingParams

SHAPES = {"chain": ((1, 1, 1), 3), "tree": ((3, 2, 2), 10)}
SHIPPED = [prompt for suite in load_default_suites() for prompt in suite.prompts]


def spec(kind: HeadKind, shape: str = "tree", **extra: Any) -> SpeculativeConfig:
    topk, nodes = SHAPES[shape]
    return SpeculativeConfig(
        method="draft_heads",
        causal=kind == "causal",
        tree_topk=topk,
        max_tree_nodes=nodes,
        **extra,
    )


def engine(
    tiny: Any, speculative: SpeculativeConfig | None, heads: DraftHeads | None = None
) -> Any:
    model, tokenizer = tiny
    config = TransformersEngineConfig(model="tiny", speculative=speculative, warmup_tokens=0)
    built = TransformersEngine(config, model=model, tokenizer=tokenizer, heads=heads)
    built.load()
    return built


def request(
    messages: tuple[Message, ...], max_tokens: int = 16, **sampling: Any
) -> GenerationRequest:
    return GenerationRequest(
        messages=messages, sampling=SamplingParams(max_tokens=max_tokens, **sampling)
    )


@pytest.fixture(scope="module")
def trained(chaotic: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[HeadKind, DraftHeads]:
    """Heads of both kinds trained on the chaotic model's own outputs for the shipped
    prompts: they memorise the training continuations, so verification accepts drafts
    (often not the first child) as well as rejecting them."""
    model, tokenizer = chaotic
    root = tmp_path_factory.mktemp("heads")
    prompts = [SeedPrompt(p.category, p.messages) for p in SHIPPED]
    plan = TrainPlan(
        name="test",
        data=DataPlan(temperatures=(0.0,), max_new_tokens=16, batch_size=64, held_out=0.1),
        depth=3,
        layers=2,
        vocab_limit=512,
        epochs=12,
        patience=12,
        learning_rate=2e-2,
        weight_decay=0.0,
        prompt_weight=0.0,
    )
    train_heads(model, tokenizer, prompts, plan, root=root, model_name="tiny", model_identity="t")
    return {
        kind: load_heads(root / kind, kind, model, identity="t")[0]
        for kind in ("causal", "independent")
    }


def check_identities(result: GenerationResult, depth: int) -> None:
    stats, cost = result.speculative, result.draft_cost
    assert stats is not None and cost is not None
    assert result.output_tokens == stats.accepted_tokens + stats.verify_steps
    assert sum(stats.accepted_per_position) == stats.accepted_tokens
    assert sum(stats.drafted_per_position) == stats.draft_tokens
    assert len(stats.drafted_per_position) == depth
    assert all(
        a <= d for a, d in zip(stats.accepted_per_position, stats.drafted_per_position, strict=True)
    )
    assert all(a >= b for a, b in itertools.pairwise(stats.accepted_per_position))
    assert stats.draft_tokens is not None and cost.tree_tokens >= stats.draft_tokens
    assert cost.draft_s > 0 and cost.verify_s > 0


class TestLossless:
    @pytest.mark.parametrize("shape", list(SHAPES))
    @pytest.mark.parametrize("kind", ["causal", "independent"])
    def test_random_heads_on_every_shipped_prompt(
        self, chaotic: Any, kind: HeadKind, shape: str
    ) -> None:
        """Untrained random heads draft nonsense; the greedy output is still the
        baseline's, token for token, on every shipped prompt."""
        heads = initialised_heads(chaotic[0], kind, 3, scale=0.2, seed=5)
        base, drafted = engine(chaotic, None), engine(chaotic, spec(kind, shape), heads)
        for prompt in SHIPPED:
            expected = base.generate(request(prompt.messages))
            result = drafted.generate(request(prompt.messages))
            assert result.token_ids == expected.token_ids, prompt.id
            if expected.error is ErrorKind.INVALID:  # longer than the tiny model's context
                assert result.error is ErrorKind.INVALID
                continue
            check_identities(result, 3)

    @pytest.mark.slow  # trains heads of both kinds (the module's `trained` fixture)
    @pytest.mark.parametrize("shape", list(SHAPES))
    @pytest.mark.parametrize("kind", ["causal", "independent"])
    def test_trained_heads_on_every_shipped_prompt(
        self, chaotic: Any, trained: dict[HeadKind, DraftHeads], kind: HeadKind, shape: str
    ) -> None:
        """Trained heads get drafts accepted, deep ones included, and the greedy output
        is still the baseline's on every shipped prompt."""
        base, drafted = engine(chaotic, None), engine(chaotic, spec(kind, shape), trained[kind])
        accepted = [0, 0, 0]
        for prompt in SHIPPED:
            expected = base.generate(request(prompt.messages))
            result = drafted.generate(request(prompt.messages))
            assert result.token_ids == expected.token_ids, prompt.id
            if expected.error is ErrorKind.INVALID:  # longer than the tiny model's context
                assert result.error is ErrorKind.INVALID
                continue
            check_identities(result, 3)
            assert result.speculative is not None
            accepted = [
                a + b
                for a, b in zip(accepted, result.speculative.accepted_per_position, strict=True)
            ]
        assert accepted[1] > 0  # paths accepted: the cache kept the right entries


class TestSampling:
    @pytest.mark.slow  # trains heads of both kinds (the module's `trained` fixture)
    def test_seeded_sampling_is_reproducible_and_varies_with_the_seed(
        self, chaotic: Any, trained: dict[HeadKind, DraftHeads]
    ) -> None:
        drafted = engine(chaotic, spec("causal"), trained["causal"])
        messages = SHIPPED[0].messages
        first = drafted.generate(request(messages, temperature=1.0, seed=1))
        again = drafted.generate(request(messages, temperature=1.0, seed=1))
        other = drafted.generate(request(messages, temperature=1.0, seed=2))
        assert first.token_ids == again.token_ids
        assert first.token_ids != other.token_ids
        check_identities(first, 3)

    def test_first_token_follows_the_target_distribution(self, chaotic: Any) -> None:
        """The first sampled token's frequencies over seeds match the baseline's."""
        heads = initialised_heads(chaotic[0], "causal", 3, scale=0.2, seed=5)
        base, drafted = engine(chaotic, None), engine(chaotic, spec("causal"), heads)
        messages = (Message("user", "hello"),)
        counts: dict[str, dict[int, int]] = {"base": {}, "heads": {}}
        for seed in range(300):
            for name, arm in (("base", base), ("heads", drafted)):
                token = arm.generate(request(messages, max_tokens=1, temperature=2.0, seed=seed))
                first = token.token_ids[0]
                counts[name][first] = counts[name].get(first, 0) + 1
        tokens = set(counts["base"]) | set(counts["heads"])
        gap = sum(abs(counts["base"].get(t, 0) - counts["heads"].get(t, 0)) for t in tokens)
        assert gap / 2 / 300 < 0.2  # total variation distance of two 300-draw samples


class TestEngine:
    def test_identity_names_kind_tree_and_memory(self, chaotic: Any) -> None:
        heads = initialised_heads(chaotic[0], "independent", 3)
        built = engine(chaotic, spec("independent"), heads)
        identity = built.identity
        assert identity["method"] == "draft_heads" and identity["causal"] == "false"
        assert identity["tree_topk"] == "3,2,2" and identity["max_tree_nodes"] == "10"
        assert int(identity["draft_bytes"]) == heads.extra_bytes() > 0

    def test_more_depth_than_the_heads_is_a_config_error(self, chaotic: Any) -> None:
        heads = initialised_heads(chaotic[0], "causal", 2)
        with pytest.raises(EngineConfigError, match="train-heads"):
            engine(chaotic, spec("causal"), heads)

    def test_untrained_heads_name_the_command(self, chaotic: Any, tmp_path: Path) -> None:
        """A model without trained heads fails at load with the command to run."""
        model, tokenizer = chaotic
        model_dir = tmp_path / "tiny-model"
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        config = TransformersEngineConfig(
            model=str(model_dir), device="cpu", speculative=spec("causal"), warmup_tokens=0
        )
        built = TransformersEngine(config, models_dir=tmp_path / "models")
        with pytest.raises(HeadsNotTrainedError, match="canaryd models train-heads"):
            built.load()
        built.close()

    def test_timeout_cuts_the_loop(self, chaotic: Any) -> None:
        heads = initialised_heads(chaotic[0], "causal", 3, scale=0.2)
        built = engine(chaotic, spec("causal"), heads)
        timed = GenerationRequest(
            messages=(Message("user", "hello"),),
            sampling=SamplingParams(max_tokens=800),
            timeout_s=0.05,
        )
        result = built.generate(timed)
        assert result.error is ErrorKind.TIMEOUT
        assert result.output_tokens < 800


def test_default_depth_follows_the_tree() -> None:
    """num_draft_tokens defaults to the tree's depth; a disagreeing pair is refused."""
    assert SpeculativeConfig(method="draft_heads").num_draft_tokens == 4
    assert SpeculativeConfig(method="draft_heads", tree_topk=(2, 1)).num_draft_tokens == 2
    assert SpeculativeConfig(method="draft_heads", num_draft_tokens=6).heads_tree == (
        3,
        2,
        2,
        1,
        1,
        1,
    )
    with pytest.raises(ValueError, match="tree_topk"):
        SpeculativeConfig(method="draft_heads", tree_topk=(2, 1), num_draft_tokens=3)
