"""The decoding loop of `method = "draft_heads"`: draft a tree, verify it in one pass.

Prefill emits the target's first token: a step with an empty draft. Every later step
drafts a tree from the last accepted node's hidden state, runs the target once over the
root and all drafts with a tree attention mask and depth-based position ids, walks the
tree (`tree.walk`), emits the accepted drafts plus the target's own bonus token, and
keeps only the accepted path in the KV cache. Counts go to a `StepRecorder` as each
step ends (drafted depth, accepted drafts), so `output = accepted + steps` exactly, and
the loop times its drafting apart from its verifying.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from engine.config import SpeculativeConfig
from engine.errors import EngineConfigError
from engine.heads.model import DraftHeads, HeadKind, cache_argument, load_trained_heads
from engine.heads.tree import DraftTree, TokenChooser, build_tree, tree_attention, walk
from engine.types import DraftCost, SamplingParams


class StepRecorder(Protocol):
    """Receives each verify step's counts: `drafted(n)` (the tree's depth: the most
    tokens the step could accept), then `verified(accepted)`."""

    def drafted(self, n: int) -> None: ...

    def verified(self, accepted: int) -> None: ...


@dataclass
class HeadsDecoding:
    """What one decode produced and what it cost."""

    token_ids: list[int]
    first_token_at: float | None = None
    deliveries: list[tuple[float, int]] = field(default_factory=list)  # (perf_counter, tokens)
    timed_out: bool = False
    draft_s: float = 0.0
    verify_s: float = 0.0
    tree_tokens: int = 0  # drafts verified, every branch of every tree

    def output(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """Prompt and generated ids, (1, prompt + generated), as `generate` returns."""
        produced = torch.tensor([self.token_ids], dtype=prompt_ids.dtype)
        return torch.cat((prompt_ids, produced.to(prompt_ids.device)), dim=1)

    @property
    def cost(self) -> DraftCost:
        return DraftCost(self.draft_s, self.verify_s, self.tree_tokens)


@dataclass(frozen=True)
class TreeShape:
    topk: tuple[int, ...]
    max_nodes: int


def heads_decoder(
    model: Any,
    spec: SpeculativeConfig,
    heads: DraftHeads | None,
    model_name: str,
    models_dir: Path | None,
) -> HeadsDecoder:
    """The loop for `spec` on `model`: with `heads` when given, else the trained ones
    of the kind `spec` names (`canaryd models train-heads`)."""
    kind: HeadKind = "causal" if spec.causal else "independent"
    if heads is None:
        heads, _metadata = load_trained_heads(model, model_name, models_dir, kind)
    if heads.kind != kind or spec.num_draft_tokens > heads.depth:
        raise EngineConfigError(
            "speculative",
            f"{spec.num_draft_tokens} {kind} heads wanted, the trained ones are "
            f"{heads.depth} {heads.kind} heads: lower num_draft_tokens (tree_topk) or "
            "train deeper heads (`canaryd models train-heads --depth N`)",
        )
    shape = TreeShape(topk=spec.heads_tree, max_nodes=spec.max_tree_nodes)
    return HeadsDecoder(model, heads, shape)


class HeadsDecoder:
    """Decodes with `heads` on `model` (a transformers causal LM with a DynamicCache)."""

    def __init__(self, model: Any, heads: DraftHeads, shape: TreeShape) -> None:
        from transformers import DynamicCache

        self.model = model
        self.heads = heads
        self.shape = shape
        self._cache_type = DynamicCache
        self._cache_arg = cache_argument(model)
        self._embed = model.get_input_embeddings()
        self._output = model.get_output_embeddings()
        self._device = model.get_output_embeddings().weight.device
        self._dtype = model.get_output_embeddings().weight.dtype

    def decode(
        self,
        prompt_ids: torch.Tensor,
        *,
        max_new_tokens: int,
        sampling: SamplingParams,
        eos_ids: set[int],
        recorder: StepRecorder,
        deadline: float | None = None,
        greedy_fault: bool = False,
    ) -> HeadsDecoding:
        chooser = TokenChooser(sampling, self._device, greedy_fault=greedy_fault)
        cache = self._cache_type(config=self.model.config)
        out = HeadsDecoding(token_ids=[])
        started = time.perf_counter()
        hidden = self._forward(prompt_ids, cache, None, None)[0, -1]
        _choice, root = chooser.choose(self._output(hidden), [])
        recorder.drafted(0)
        recorder.verified(0)
        out.token_ids.append(root)
        out.first_token_at = time.perf_counter()
        out.deliveries.append((out.first_token_at, 1))
        out.verify_s += out.first_token_at - started
        past = int(prompt_ids.shape[1])
        while root not in eos_ids and len(out.token_ids) < max_new_tokens:
            if deadline is not None and time.perf_counter() >= deadline:
                out.timed_out = True
                break
            began = time.perf_counter()
            tree = build_tree(
                self.heads, hidden, root, self._embed, self.shape.topk, self.shape.max_nodes
            )
            self._sync()
            drafted_at = time.perf_counter()
            path, bonus, hidden = self._verify(tree, past, cache, chooser)
            emitted = self._emitted(
                [tree.tokens[n] for n in path[1:]] + [bonus],
                eos_ids,
                max_new_tokens - len(out.token_ids),
            )
            recorder.drafted(tree.depth)
            recorder.verified(len(emitted) - 1)
            out.token_ids.extend(emitted)
            out.deliveries.append((time.perf_counter(), len(emitted)))
            out.tree_tokens += tree.size
            past += len(path)
            root = emitted[-1]
            self._sync()
            out.draft_s += drafted_at - began
            out.verify_s += time.perf_counter() - drafted_at
        return out

    def _verify(
        self, tree: DraftTree, past: int, cache: Any, chooser: TokenChooser
    ) -> tuple[list[int], int, torch.Tensor]:
        mask, positions = tree_attention(tree, past, self._dtype, self._device)
        ids = torch.tensor([tree.tokens], device=self._device)
        hidden = self._forward(ids, cache, mask, positions)[0]
        path, bonus, last = walk(tree, hidden, self._output, chooser)
        _keep_path(cache, past, path)
        return path, bonus, last

    def _forward(
        self,
        ids: torch.Tensor,
        cache: Any,
        mask: torch.Tensor | None,
        positions: torch.Tensor | None,
    ) -> torch.Tensor:
        kwargs: dict[str, Any] = {self._cache_arg: cache, "use_cache": True}
        if mask is None:
            kwargs["attention_mask"] = torch.ones_like(ids)
        else:
            kwargs |= {"attention_mask": mask, "position_ids": positions}
        hidden: torch.Tensor = self.model.base_model(ids, **kwargs).last_hidden_state
        return hidden

    @staticmethod
    def _emitted(tokens: list[int], eos_ids: set[int], room: int) -> list[int]:
        """This step's tokens, cut after an end-of-sequence token and to `room`."""
        for index, token in enumerate(tokens):
            if token in eos_ids:
                tokens = tokens[: index + 1]
                break
        return tokens[:room]

    def _sync(self) -> None:
        """Timings split draft from verify only if the device has finished its work."""
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)


def _keep_path(cache: Any, past: int, path: list[int]) -> None:
    """Keep the cached prefix and the accepted path's entries; drop the other drafts."""
    keep = len(path)
    if path == list(range(keep)):
        rows = None
    else:
        rows = torch.tensor(path, device=cache.layers[0].keys.device) + past
    for layer in cache.layers:
        if rows is not None:
            layer.keys[..., past : past + keep, :] = layer.keys[..., rows, :]
            layer.values[..., past : past + keep, :] = layer.values[..., rows, :]
        layer.keys = layer.keys[..., : past + keep, :]
        layer.values = layer.values[..., : past + keep, :]
