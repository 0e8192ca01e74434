"""The head networks and their files: what they compute, what a load checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.errors import HeadsFileError, HeadsNotTrainedError
from engine.heads.model import (
    HeadsMetadata,
    initialised_heads,
    load_heads,
    model_identity,
    save_heads,
    trained_heads_location,
)

VOCAB = torch.tensor([2, 5, 40, 41, 99, 300])


def metadata(heads: Any, identity: str = "t") -> HeadsMetadata:
    return HeadsMetadata(
        kind=heads.kind,
        depth=heads.depth,
        layers=heads.layers,
        hidden_size=heads.hidden_size,
        vocab_size=heads.full_vocab_size,
        reduced_vocab_size=heads.reduced_vocab_size,
        model="tiny",
        model_identity=identity,
        sha256="",
    )


class TestHeads:
    @pytest.mark.parametrize("kind", ["causal", "independent"])
    def test_fresh_heads_repeat_the_targets_distribution(self, chaotic: Any, kind: str) -> None:
        """Identity-initialised heads give the target's own logits on the reduced
        vocabulary, whatever the path."""
        model, _tokenizer = chaotic
        heads = initialised_heads(model, kind, 2, vocab_ids=VOCAB)  # type: ignore[arg-type]
        hidden = torch.randn(3, model.config.hidden_size)
        path = torch.randn(3, 2, model.config.hidden_size)
        with torch.no_grad():
            expected = model.get_output_embeddings()(hidden)[:, VOCAB]
            for depth in (1, 2):
                got = heads.logits(depth, hidden, path[:, :depth] if heads.causal else None)
                assert torch.allclose(got, expected, atol=1e-5)

    def test_extra_memory_counts_parameters_and_output_rows(self, chaotic: Any) -> None:
        model, _tokenizer = chaotic
        heads = initialised_heads(model, "independent", 2, vocab_ids=VOCAB)
        hidden = model.config.hidden_size
        per_head = hidden * hidden + hidden + len(VOCAB)
        expected = 4 * (2 * per_head + len(VOCAB) * hidden) + 8 * len(VOCAB)
        assert heads.extra_bytes() == expected

    def test_causal_heads_need_their_path(self, chaotic: Any) -> None:
        heads = initialised_heads(chaotic[0], "causal", 2)
        with pytest.raises(ValueError, match="path embeddings"):
            heads.logits(2, torch.randn(1, chaotic[0].config.hidden_size), None)


class TestFiles:
    def test_round_trip(self, chaotic: Any, tmp_path: Path) -> None:
        model, _tokenizer = chaotic
        heads = initialised_heads(model, "causal", 2, vocab_ids=VOCAB, scale=0.1, seed=2)
        saved = save_heads(heads, tmp_path, metadata(heads))
        loaded, meta = load_heads(tmp_path, "causal", model, identity="t")
        assert meta == saved and len(meta.sha256) == 64
        hidden = torch.randn(2, model.config.hidden_size)
        path = torch.randn(2, 2, model.config.hidden_size)
        with torch.no_grad():
            assert torch.equal(heads.logits(2, hidden, path), loaded.logits(2, hidden, path))

    def test_missing_heads_name_the_command(self, chaotic: Any, tmp_path: Path) -> None:
        with pytest.raises(HeadsNotTrainedError, match="run `canaryd models train-heads`"):
            load_heads(tmp_path / "causal", "causal", chaotic[0], identity=None)

    def test_altered_weights_are_refused(self, chaotic: Any, tmp_path: Path) -> None:
        model, _tokenizer = chaotic
        heads = initialised_heads(model, "independent", 1, vocab_ids=VOCAB)
        save_heads(heads, tmp_path, metadata(heads))
        weights = tmp_path / "heads.safetensors"
        weights.write_bytes(weights.read_bytes()[:-1] + b"\x01")
        with pytest.raises(HeadsFileError, match="sha256"):
            load_heads(tmp_path, "independent", model, identity="t")

    def test_heads_of_another_model_are_refused(self, chaotic: Any, tmp_path: Path) -> None:
        model, _tokenizer = chaotic
        heads = initialised_heads(model, "independent", 1, vocab_ids=VOCAB)
        save_heads(heads, tmp_path, metadata(heads, identity="other"))
        with pytest.raises(HeadsFileError, match="trained on other"):
            load_heads(tmp_path, "independent", model, identity="t")

    def test_location_follows_the_model(self, chaotic: Any, tmp_path: Path) -> None:
        """Heads live under <models dir>/heads/<model directory name>/<kind>, and the
        identity changes with the weights."""
        model, _tokenizer = chaotic
        model_dir = tmp_path / "tiny-model"
        model.save_pretrained(model_dir)
        directory, identity = trained_heads_location(str(model_dir), tmp_path / "m", "causal")
        assert directory == tmp_path / "m" / "heads" / "tiny-model" / "causal"
        assert identity == model_identity(model_dir)
        (model_dir / "model.safetensors").write_bytes(b"changed")
        assert model_identity(model_dir) != identity
