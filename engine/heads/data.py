"""Self-distillation data for draft heads: the target's own generations, recorded.

Every prompt is continued by the target, greedily and at each sampling temperature of
the plan, in batches of similar prompt length with left padding; a row that reaches
end-of-sequence leaves the batch and its cache. For every generated token the loop
records the hidden state that produced it and the target's top-k distribution there
(soft labels), so no second pass over the text is needed. Greedy rows also record the
prompt's own positions (after the preamble every prompt shares): the target's
predictions over text it reads, from the prefill the generation needs anyway. Batches
are written as shards, each seeded by its index: an interrupted run resumes at the
first missing shard and produces the same data. Prompts are split into training and
held-out sets by prompt, so no held-out prompt's text is ever trained on.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.heads.model import cache_argument
from engine.types import Message

Tick = Callable[[int], None]


@dataclass(frozen=True)
class SeedPrompt:
    """A prompt to continue: its category (for reporting) and its messages."""

    category: str
    messages: tuple[Message, ...]


@dataclass(frozen=True)
class DataPlan:
    """How much the target generates. Each prompt is continued once per temperature
    (0: greedy) for up to `max_new_tokens`; `top_k` target probabilities per token are
    kept as soft labels."""

    temperatures: tuple[float, ...]
    max_new_tokens: int
    batch_size: int = 32
    top_k: int = 8
    held_out: float = 0.15
    seed: int = 0


@dataclass
class Sequences:
    """Generated sequences, concatenated: `tokens[i]` was produced from `hidden[i]`,
    where the target's top-k was `topk_ids[i]` / `topk_probs[i]`; `starts` marks
    where each sequence begins (and `starts[-1]` is the total length)."""

    tokens: torch.Tensor  # (N,) long
    hidden: torch.Tensor  # (N, H) float16
    topk_ids: torch.Tensor  # (N, K) long
    topk_probs: torch.Tensor  # (N, K) float32
    generated: torch.Tensor  # (N,) bool: the target's own token, not the prompt's
    starts: torch.Tensor  # (S + 1,) long
    categories: list[str]

    @property
    def size(self) -> int:
        return int(self.tokens.numel())

    @classmethod
    def concat(cls, parts: Sequence[Sequences]) -> Sequences:
        lengths = torch.cat([p.starts.diff() for p in parts]) if parts else torch.zeros(0)
        return cls(
            tokens=torch.cat([p.tokens for p in parts]),
            hidden=torch.cat([p.hidden for p in parts]),
            topk_ids=torch.cat([p.topk_ids for p in parts]),
            topk_probs=torch.cat([p.topk_probs for p in parts]),
            generated=torch.cat([p.generated for p in parts]),
            starts=torch.cat((torch.zeros(1, dtype=torch.long), lengths.long().cumsum(0))),
            categories=[c for p in parts for c in p.categories],
        )


def split_prompts(
    prompts: Sequence[SeedPrompt], held_out: float, seed: int
) -> tuple[list[int], list[int]]:
    """Indices of training and held-out prompts: a seeded share of each category."""
    rng = random.Random(seed)  # noqa: S311  (a data split, not security)
    train: list[int] = []
    test: list[int] = []
    for category in sorted({p.category for p in prompts}):
        members = [i for i, p in enumerate(prompts) if p.category == category]
        rng.shuffle(members)
        cut = max(1, round(len(members) * held_out)) if len(members) > 1 else 0
        test.extend(members[:cut])
        train.extend(members[cut:])
    return sorted(train), sorted(test)


def jobs(
    prompts: Sequence[SeedPrompt], plan: DataPlan, lengths: Sequence[int]
) -> list[tuple[int, float]]:
    """(prompt index, temperature) for every generation, ordered by prompt length so
    that a batch pads little."""
    work = [(i, t) for t in plan.temperatures for i in range(len(prompts))]
    return sorted(work, key=lambda job: (lengths[job[0]], job[1], job[0]))


def generate_shards(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[SeedPrompt],
    plan: DataPlan,
    directory: Path,
    *,
    tick: Tick | None = None,
) -> list[Path]:
    """Write every missing shard of `plan` into `directory`; return all shard paths.
    `tick(n)` is called with the number of generations of each batch as it completes."""
    directory.mkdir(parents=True, exist_ok=True)
    encoded = [
        tokenizer(_prompt_text(tokenizer, p.messages), add_special_tokens=False)["input_ids"]
        for p in prompts
    ]
    shared = _common_prefix(encoded)
    work = jobs(prompts, plan, [len(e) for e in encoded])
    batches = [work[i : i + plan.batch_size] for i in range(0, len(work), plan.batch_size)]
    paths = []
    for index, batch in enumerate(batches):
        path = directory / f"shard-{index:05d}.pt"
        paths.append(path)
        if not path.is_file():
            generator = torch.Generator().manual_seed(plan.seed * 100_003 + index)
            rows = [(encoded[i], t, prompts[i].category, i) for i, t in batch]
            shard = _generate_batch(model, tokenizer, rows, plan, shared, generator)
            staged = path.with_suffix(".tmp")
            torch.save(shard, staged)
            staged.replace(path)
        if tick is not None:
            tick(len(batch))
    return paths


def load_shards(paths: Sequence[Path]) -> tuple[Sequences, list[int]]:
    """The sequences of `paths`, and the prompt index of each sequence."""
    parts: list[Sequences] = []
    prompt_ids: list[int] = []
    for path in paths:
        shard = torch.load(path, weights_only=True)
        parts.append(
            Sequences(
                tokens=shard["tokens"],
                hidden=shard["hidden"],
                topk_ids=shard["topk_ids"].long(),
                topk_probs=shard["topk_probs"].float(),
                generated=shard["generated"],
                starts=shard["starts"],
                categories=list(shard["categories"]),
            )
        )
        prompt_ids.extend(int(i) for i in shard["prompts"])
    return Sequences.concat(parts), prompt_ids


def _prompt_text(tokenizer: Any, messages: tuple[Message, ...]) -> str:
    chat = [{"role": m.role, "content": m.content} for m in messages]
    if tokenizer.chat_template:
        text: str = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        return text
    return "\n\n".join(m.content for m in messages) + "\n"


def _common_prefix(encoded: Sequence[list[int]]) -> int:
    """Tokens every prompt starts with (a chat template's system preamble): recorded
    once per prompt they would only repeat one context."""
    if not encoded:
        return 0
    shortest = min(len(e) for e in encoded)
    for n in range(shortest):
        if any(e[n] != encoded[0][n] for e in encoded):
            return n
    return shortest


Row = tuple[list[int], float, str, int]  # prompt ids, temperature, category, prompt index


@torch.inference_mode()
def _generate_batch(
    model: Any,
    tokenizer: Any,
    rows: list[Row],
    plan: DataPlan,
    shared_prefix: int,
    generator: torch.Generator,
) -> dict[str, Any]:
    """Continue one batch of prompts, left-padded, recording hidden states and top-k;
    greedy rows also record the prompt's own positions after the shared prefix."""
    from transformers import DynamicCache

    output = model.get_output_embeddings()
    device = output.weight.device
    width = max(len(r[0]) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(r[0])) + r[0] for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r[0])) + [1] * len(r[0]) for r in rows], device=device)
    temperatures = torch.tensor([r[1] for r in rows], device=device)
    eos = model.generation_config.eos_token_id
    eos_ids = torch.tensor(eos if isinstance(eos, list) else [eos], device=device)
    cache = DynamicCache(config=model.config)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    cache_arg = cache_argument(model)
    step_input = ids
    prompt_parts: list[tuple[torch.Tensor, ...]] = []
    # per row: the generated (token, hidden, top-k ids, top-k probs) steps
    steps: list[list[tuple[torch.Tensor, ...]]] = [[] for _ in rows]
    active = torch.arange(len(rows), device=device)  # rows still generating
    for step in range(plan.max_new_tokens):
        states = model.base_model(
            step_input,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{cache_arg: cache},
        ).last_hidden_state
        if step == 0:
            prompt_parts = [
                _prompt_positions(output, states[b], ids[b], len(r[0]), shared_prefix, plan)
                if r[1] == 0
                else _no_positions(states, plan)
                for b, r in enumerate(rows)
            ]
        hidden = states[:, -1]
        probs = output(hidden).float().softmax(-1)
        top_probs, top_ids = probs.topk(plan.top_k, dim=-1)
        token = _pick(probs, temperatures, generator)
        for i, row in enumerate(active.tolist()):
            steps[row].append((token[i], hidden[i].half(), top_ids[i].int(), top_probs[i].half()))
        running = ~torch.isin(token, eos_ids)
        if not bool(running.any()):
            break
        if not bool(running.all()):  # finished rows leave the batch, and the cache
            kept = running.nonzero()[:, 0]
            cache.batch_select_indices(kept)
            active, token, mask = active[kept], token[kept], mask[kept]
            positions, temperatures = positions[kept], temperatures[kept]
        step_input = token[:, None]
        mask = torch.cat((mask, torch.ones_like(mask[:, :1])), dim=1)
        positions = positions[:, -1:] + 1
    columns: list[list[torch.Tensor]] = [[], [], [], [], []]
    sizes = []
    for prompt_part, generated in zip(prompt_parts, steps, strict=True):
        for i in range(4):
            columns[i] += [prompt_part[i], torch.stack([g[i] for g in generated])]
        columns[4] += [
            torch.zeros(len(prompt_part[0]), dtype=torch.bool),
            torch.ones(len(generated), dtype=torch.bool),
        ]
        sizes.append(len(prompt_part[0]) + len(generated))
    tokens, hidden_all, top_ids_all, top_probs_all, flags = (
        torch.cat([t.cpu() for t in column]) for column in columns
    )
    return {
        "tokens": tokens.long(),
        "hidden": hidden_all,
        "topk_ids": top_ids_all,
        "topk_probs": top_probs_all,
        "generated": flags,
        "starts": torch.tensor([0, *sizes]).cumsum(0),
        "categories": [r[2] for r in rows],
        "prompts": torch.tensor([r[3] for r in rows]),
    }


def _prompt_positions(
    output: Any,
    states: torch.Tensor,
    ids: torch.Tensor,
    length: int,
    shared_prefix: int,
    plan: DataPlan,
) -> tuple[torch.Tensor, ...]:
    """One prompt's own positions as (next token, hidden, top-k ids, top-k probs): the
    hidden state after each prompt token but the last (which starts the generation)."""
    width = int(ids.shape[0])
    first = width - length + max(shared_prefix - 1, 0)
    hidden = states[first : width - 1]
    top_probs, top_ids = output(hidden).float().softmax(-1).topk(plan.top_k, dim=-1)
    return ids[first + 1 : width], hidden.half(), top_ids.int(), top_probs.half()


def _no_positions(states: torch.Tensor, plan: DataPlan) -> tuple[torch.Tensor, ...]:
    device, hidden_size = states.device, int(states.shape[-1])
    return (
        torch.zeros(0, dtype=torch.long, device=device),
        torch.zeros(0, hidden_size, dtype=torch.half, device=device),
        torch.zeros(0, plan.top_k, dtype=torch.int, device=device),
        torch.zeros(0, plan.top_k, dtype=torch.half, device=device),
    )


def _pick(
    probs: torch.Tensor, temperatures: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """Greedy where the temperature is 0, else a sample at that temperature."""
    greedy = probs.argmax(-1)
    hot = temperatures > 0
    if not bool(hot.any()):
        return greedy
    scaled = (probs.clamp_min(1e-30).log() / temperatures.clamp_min(1e-6)[:, None]).softmax(-1)
    sampled = torch.multinomial(scaled.cpu(), 1, generator=generator)[:, 0].to(probs.device)
    return torch.where(hot, sampled, greedy)
