"""Self-distillation data and head training, on a tiny model built in code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from canaryd.pairs.suites import load_default_suites
from engine.heads.data import DataPlan, SeedPrompt, generate_shards, load_shards, split_prompts
from engine.heads.model import HEAD_KINDS, load_heads, read_metadata
from engine.heads.train import TrainPlan, train_heads

PROMPTS = [
    SeedPrompt(p.category, p.messages) for suite in load_default_suites() for p in suite.prompts[:3]
]
PLAN = TrainPlan(
    name="test",
    data=DataPlan(temperatures=(0.0, 1.0), max_new_tokens=10, batch_size=16, held_out=0.34),
    depth=2,
    vocab_limit=256,
    epochs=3,
    patience=3,
)


class StopTrainingError(Exception):
    pass


class StopAfter:
    """A progress sink that interrupts the `phase` one step into its second epoch."""

    def __init__(self, phase: str) -> None:
        self.target, self.current, self.seen, self.limit = phase, "", 0, 0

    def phase(self, description: str, total: int | None) -> None:
        self.current = description
        if description == self.target and total:
            self.limit = total // PLAN.epochs + 1

    def advance(self, amount: int = 1) -> None:
        if self.current == self.target:
            self.seen += amount
            if self.seen >= self.limit:
                raise StopTrainingError


def train(model: Any, tokenizer: Any, root: Path, **kwargs: Any) -> Any:
    return train_heads(
        model, tokenizer, PROMPTS, PLAN, root=root, model_name="tiny", model_identity="t", **kwargs
    )


class TestData:
    def test_shards_record_what_the_target_did(self, chaotic: Any, tmp_path: Path) -> None:
        """Each recorded token came from its hidden state: greedy tokens are the
        target's argmax there, and the top-k holds the target's own probabilities."""
        model, tokenizer = chaotic
        plan = DataPlan(temperatures=(0.0,), max_new_tokens=6, batch_size=8)
        paths = generate_shards(model, tokenizer, PROMPTS[:8], plan, tmp_path)
        data, prompt_of = load_shards(paths)
        assert sorted(prompt_of) == list(range(8))
        with torch.no_grad():
            probs = model.get_output_embeddings()(data.hidden.float()).softmax(-1)
        generated = data.generated
        assert bool(generated.any()) and bool((~generated).any())
        assert torch.equal(data.tokens[generated], probs[generated].argmax(-1))
        picked = probs.gather(1, data.topk_ids)
        assert torch.allclose(picked, data.topk_probs, atol=2e-3)

    def test_shards_are_reproducible_and_resume(self, chaotic: Any, tmp_path: Path) -> None:
        """A missing shard is regenerated exactly; existing ones are kept."""
        model, tokenizer = chaotic
        plan = DataPlan(temperatures=(0.0, 1.0), max_new_tokens=6, batch_size=8, seed=3)
        paths = generate_shards(model, tokenizer, PROMPTS[:8], plan, tmp_path)
        first = torch.load(paths[1], weights_only=True)
        paths[1].unlink()
        kept = paths[0].stat().st_mtime_ns
        generate_shards(model, tokenizer, PROMPTS[:8], plan, tmp_path)
        again = torch.load(paths[1], weights_only=True)
        assert torch.equal(first["tokens"], again["tokens"])
        assert paths[0].stat().st_mtime_ns == kept

    def test_held_out_prompts_cover_every_category(self) -> None:
        train_ids, test_ids = split_prompts(PROMPTS, 0.34, 0)
        assert not set(train_ids) & set(test_ids)
        assert sorted(train_ids + test_ids) == list(range(len(PROMPTS)))
        assert {PROMPTS[i].category for i in test_ids} == {p.category for p in PROMPTS}


class TestTraining:
    def test_both_kinds_saved_with_figures(self, chaotic: Any, tmp_path: Path) -> None:
        """Both kinds land under root/<kind> with their sha256 and held-out accuracy
        per head, and load back into working heads."""
        model, tokenizer = chaotic
        saved = train(model, tokenizer, tmp_path)
        assert set(saved) == set(HEAD_KINDS)
        for kind, meta in saved.items():
            on_disk = read_metadata(tmp_path / kind)
            assert on_disk is not None and on_disk.sha256 == meta.sha256
            assert on_disk.training["held_out_accuracy"] == meta.training["held_out_accuracy"]
            assert len(meta.training["held_out_accuracy"]) == 2
            assert meta.training["chain_acceptance"] >= 1.0
            assert meta.training["generated_tokens"] > 0
            heads, _meta = load_heads(tmp_path / kind, kind, model, identity="t")
            assert heads.depth == 2 and heads.reduced_vocab_size <= 256

    def test_training_lowers_the_loss(self, chaotic: Any, tmp_path: Path) -> None:
        model, tokenizer = chaotic
        saved = train(model, tokenizer, tmp_path)
        for meta in saved.values():
            history = meta.training["history"]
            assert history[-1]["loss"] < history[0]["loss"]

    def test_an_interrupted_run_resumes_to_the_same_heads(
        self, chaotic: Any, tmp_path: Path
    ) -> None:
        """Interrupted during the causal heads' second epoch, a rerun continues from
        the checkpoint and saves exactly what an uninterrupted run saves."""
        model, tokenizer = chaotic
        whole = train(model, tokenizer, tmp_path / "whole")
        with pytest.raises(StopTrainingError):
            train(model, tokenizer, tmp_path / "cut", progress=StopAfter("training causal heads"))
        assert (tmp_path / "cut" / "work-test" / "train-causal.pt").is_file()
        resumed = train(model, tokenizer, tmp_path / "cut")
        for kind in HEAD_KINDS:
            assert resumed[kind].sha256 == whole[kind].sha256
