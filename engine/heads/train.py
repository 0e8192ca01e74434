"""Training draft heads by self-distillation, both kinds on the same data.

`train_heads` generates the data (`data.generate_shards`), picks the reduced vocabulary
(the tokens the target emitted in the training split, likeliest first), then trains
independent and causal heads on identical examples: head d at a position learns the
target's own top-k distribution d tokens later, causal heads teacher-forced on the true
path. Prompt positions count `prompt_weight` as much as generated ones. Every epoch is
checkpointed (weights, optimiser, best held-out state) under the work directory, so an
interrupted run resumes; the best epoch by held-out accuracy is what gets saved. The
held-out figures are the top-1 accuracy of each head against the target's argmax on
generated positions of held-out prompts, and the chain acceptance they imply.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import torch

from engine.heads.data import (
    DataPlan,
    SeedPrompt,
    Sequences,
    generate_shards,
    load_shards,
    split_prompts,
)
from engine.heads.model import (
    HEAD_KINDS,
    DraftHeads,
    HeadKind,
    HeadsMetadata,
    save_heads,
)


class TrainingProgress(Protocol):
    """Where training reports its phases (a progress bar in the CLI)."""

    def phase(self, description: str, total: int | None) -> None: ...

    def advance(self, amount: int = 1) -> None: ...


class _Silent:
    def phase(self, description: str, total: int | None) -> None:
        pass

    def advance(self, amount: int = 1) -> None:
        pass


@dataclass(frozen=True)
class TrainPlan:
    """Everything that decides what gets trained; a changed plan starts afresh."""

    name: str
    data: DataPlan
    depth: int = 4
    layers: int = 1
    vocab_limit: int = 4096
    epochs: int = 4
    patience: int = 2
    batch_size: int = 256
    learning_rate: float = 2e-3
    weight_decay: float = 0.05
    prompt_weight: float = 0.5
    head_decay: float = 0.8  # head d's loss weighs head_decay ** (d - 1)
    seed: int = 0


QUICK = TrainPlan(
    name="quick",
    data=DataPlan(temperatures=(0.0,), max_new_tokens=64, batch_size=34),
    vocab_limit=2048,
    epochs=3,
)
FULL = TrainPlan(
    name="full",
    data=DataPlan(temperatures=(0.0, 0.5, 0.8, 1.0, 1.0), max_new_tokens=192),
    vocab_limit=4096,
    epochs=6,
)


@dataclass
class KindResult:
    """What one kind's training reached (held-out figures from its best epoch)."""

    kind: HeadKind
    accuracy: list[float]  # top-1 per head position, held out
    chain_acceptance: float  # 1 + expected consecutive correct heads, held out, greedy
    epochs: int
    seconds: float
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Examples:
    """Positions of the sequences usable as training examples, with their targets."""

    data: Sequences
    index: torch.Tensor  # (E,) positions in data
    ends: torch.Tensor  # (E,) end of each example's sequence (exclusive)


def train_heads(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[SeedPrompt],
    plan: TrainPlan,
    *,
    root: Path,
    model_name: str,
    model_identity: str,
    progress: TrainingProgress | None = None,
    force: bool = False,
) -> dict[HeadKind, HeadsMetadata]:
    """Train and save both kinds of heads for `model` under `root`; resumable."""
    report = progress or _Silent()
    work = _work_dir(root, plan, model_identity, force)
    started = time.perf_counter()
    report.phase("generating data", len(prompts) * len(plan.data.temperatures))
    shard_paths = generate_shards(
        model, tokenizer, prompts, plan.data, work / "data", tick=report.advance
    )
    data, prompt_of = load_shards(shard_paths)
    train_ids, test_ids = split_prompts(prompts, plan.data.held_out, plan.data.seed)
    train_set, test_set = set(train_ids), set(test_ids)
    train = _examples(data, [p in train_set for p in prompt_of], plan.depth)
    test = _examples(data, [p in test_set for p in prompt_of], plan.depth)
    vocab_ids, coverage = _reduced_vocabulary(train, plan.vocab_limit)
    data_seconds = time.perf_counter() - started
    saved: dict[HeadKind, HeadsMetadata] = {}
    for kind in HEAD_KINDS:
        result = _train_kind(model, kind, plan, train, test, vocab_ids, work, report)
        heads = result[0]
        figures = result[1]
        training = {
            "plan": plan.name,
            "plan_details": asdict(plan),
            "seed": plan.seed,
            "train_positions": int(train.index.numel()),
            "held_out_positions": int(test.index.numel()),
            "generated_tokens": int(data.generated.sum()),
            "prompt_tokens": int((~data.generated).sum()),
            "vocab_coverage": round(coverage, 4),
            "held_out_accuracy": [round(a, 4) for a in figures.accuracy],
            "chain_acceptance": round(figures.chain_acceptance, 3),
            "epochs": figures.epochs,
            "data_seconds": round(data_seconds, 1),
            "train_seconds": round(figures.seconds, 1),
            "history": figures.history,
        }
        metadata = HeadsMetadata(
            kind=kind,
            depth=heads.depth,
            layers=heads.layers,
            hidden_size=heads.hidden_size,
            vocab_size=heads.full_vocab_size,
            reduced_vocab_size=heads.reduced_vocab_size,
            model=model_name,
            model_identity=model_identity,
            sha256="",
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            training=training,
        )
        saved[kind] = save_heads(heads, root / kind, metadata)
    return saved


def _work_dir(root: Path, plan: TrainPlan, model_identity: str, force: bool) -> Path:
    """`root/work-<plan>`, emptied when forced or when it holds another plan's work."""
    work = root / f"work-{plan.name}"
    fingerprint = json.dumps({"plan": asdict(plan), "model": model_identity}, sort_keys=True)
    marker = work / "plan.json"
    if force or (marker.is_file() and marker.read_text(encoding="utf-8") != fingerprint):
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    marker.write_text(fingerprint, encoding="utf-8")
    return work


def _examples(data: Sequences, chosen: list[bool], depth: int) -> _Examples:
    """Every position of the chosen sequences with at least one later token."""
    index, ends = [], []
    for s, keep in enumerate(chosen):
        if not keep:
            continue
        start, end = int(data.starts[s]), int(data.starts[s + 1])
        if end - start < 2:
            continue
        index.append(torch.arange(start, end - 1))
        ends.append(torch.full((end - 1 - start,), end))
    if not index:
        empty = torch.zeros(0, dtype=torch.long)
        return _Examples(data, empty, empty)
    return _Examples(data, torch.cat(index), torch.cat(ends))


def _reduced_vocabulary(train: _Examples, limit: int) -> tuple[torch.Tensor, float]:
    """The `limit` tokens most often the target's choice or top-k in training data,
    and the share of the target's top-1 choices they cover."""
    data = train.data
    positions = train.index
    top1 = data.topk_ids[positions, 0]
    counts = torch.bincount(top1, minlength=1)
    rest = torch.bincount(data.topk_ids[positions, 1:].flatten(), minlength=counts.numel())
    size = max(counts.numel(), rest.numel())
    score = torch.nn.functional.pad(counts, (0, size - counts.numel())) * 16
    score += torch.nn.functional.pad(rest, (0, size - rest.numel()))
    chosen = score.argsort(descending=True)[: min(limit, int((score > 0).sum()))]
    vocab_ids = chosen.sort().values
    covered = torch.isin(top1, vocab_ids).float().mean().item() if top1.numel() else 0.0
    return vocab_ids, covered


def _batch(
    examples: _Examples,
    rows: torch.Tensor,
    depth: int,
    embed: torch.nn.Module,
    full_to_reduced: torch.Tensor,
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """Inputs and targets of examples `rows`: hidden states, path embeddings (target's
    token, then the true next ones), and per head the target's top-k d tokens later."""
    data = examples.data
    device = full_to_reduced.device
    at = examples.index[rows]
    end = examples.ends[rows]
    offsets = torch.arange(depth + 1)
    later = at[:, None] + offsets[None]  # (B, depth + 1)
    valid = later < end[:, None]
    later = torch.minimum(later, (end - 1)[:, None])
    label_ids = full_to_reduced[data.topk_ids[later[:, 1:]].to(device)]  # (B, D, K)
    label_probs = data.topk_probs[later[:, 1:]].to(device) * (label_ids >= 0)
    label_probs = label_probs / label_probs.sum(-1, keepdim=True).clamp_min(1e-9)
    return {
        "hidden": data.hidden[at].to(device=device, dtype=dtype),
        "path": embed(data.tokens[later[:, :depth]].to(device)).to(dtype),
        "label_ids": label_ids.clamp_min(0),
        "label_probs": label_probs,
        "top1": data.topk_ids[later[:, 1:], 0].to(device),
        "valid": valid[:, 1:].to(device),
        "generated": data.generated[later[:, 1:]].to(device),
    }


def _loss(heads: DraftHeads, batch: dict[str, torch.Tensor], plan: TrainPlan) -> torch.Tensor:
    logp = heads.all_logits(batch["hidden"], batch["path"]).float().log_softmax(-1)
    picked = logp.gather(-1, batch["label_ids"])  # (B, D, K)
    per_head = -(picked * batch["label_probs"]).sum(-1)  # (B, D)
    weight = torch.where(batch["generated"], 1.0, plan.prompt_weight) * batch["valid"]
    decay = plan.head_decay ** torch.arange(heads.depth, device=per_head.device)
    return (per_head * weight * decay).sum() / weight.sum().clamp_min(1.0)


@torch.no_grad()
def evaluate(
    heads: DraftHeads,
    examples: _Examples,
    embed: torch.nn.Module,
    full_to_reduced: torch.Tensor,
    batch_size: int = 1024,
) -> tuple[list[float], float]:
    """Held-out top-1 accuracy per head against the target's argmax, on generated
    positions, and the greedy chain acceptance length those heads would reach."""
    depth = heads.depth
    correct = torch.zeros(depth)
    counted = torch.zeros(depth)
    chain_total, chain_count = 0.0, 0
    dtype = heads.output.dtype
    for start in range(0, int(examples.index.numel()), batch_size):
        rows = torch.arange(start, min(start + batch_size, int(examples.index.numel())))
        batch = _batch(examples, rows, depth, embed, full_to_reduced, dtype)
        logits = heads.all_logits(batch["hidden"], batch["path"])
        guess = heads.vocab_ids[logits.argmax(-1)]
        mask = batch["valid"] & batch["generated"]
        hit = (guess == batch["top1"]) & mask
        correct += hit.sum(0).float().cpu()
        counted += mask.sum(0).float().cpu()
        # consecutive hits from head 1, over examples whose every head is scorable
        full = mask.all(-1)
        streak = hit.long().cumprod(-1).sum(-1)
        chain_total += float(streak[full].sum())
        chain_count += int(full.sum())
    accuracy = (correct / counted.clamp_min(1)).tolist()
    return accuracy, 1.0 + chain_total / max(chain_count, 1)


def _train_kind(
    model: Any,
    kind: HeadKind,
    plan: TrainPlan,
    train: _Examples,
    test: _Examples,
    vocab_ids: torch.Tensor,
    work: Path,
    report: TrainingProgress,
) -> tuple[DraftHeads, KindResult]:
    from engine.heads.model import initialised_heads

    torch.manual_seed(plan.seed)
    embed = model.get_input_embeddings()
    heads = initialised_heads(model, kind, plan.depth, vocab_ids=vocab_ids, layers=plan.layers)
    heads.train()
    device = heads.output.device
    full_to_reduced = torch.full((heads.full_vocab_size,), -1, dtype=torch.long, device=device)
    full_to_reduced[heads.vocab_ids] = torch.arange(heads.reduced_vocab_size, device=device)
    optimiser = torch.optim.AdamW(
        heads.parameters(), lr=plan.learning_rate, weight_decay=plan.weight_decay
    )
    steps_per_epoch = max(1, math.ceil(int(train.index.numel()) / plan.batch_size))
    total_steps = steps_per_epoch * plan.epochs
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda step: 0.5 * (1 + math.cos(math.pi * min(step / total_steps, 1.0)))
    )
    checkpoint = work / f"train-{kind}.pt"
    state: dict[str, Any] = {"epoch": 0, "best": None, "best_score": -1.0, "history": []}
    if checkpoint.is_file():
        saved = torch.load(checkpoint, weights_only=False)
        heads.load_state_dict(saved["heads"])
        optimiser.load_state_dict(saved["optimiser"])
        schedule.load_state_dict(saved["schedule"])
        state = saved["state"]
    report.phase(f"training {kind} heads", total_steps)
    report.advance(state["epoch"] * steps_per_epoch)
    generator = torch.Generator().manual_seed(plan.seed + 1)
    for _ in range(state["epoch"]):  # the same shuffles as an uninterrupted run
        torch.randperm(int(train.index.numel()), generator=generator)
    started = time.perf_counter() - sum(h["seconds"] for h in state["history"])
    while state["epoch"] < plan.epochs and not state.get("stopped", False):
        epoch_began = time.perf_counter()
        order = torch.randperm(int(train.index.numel()), generator=generator)
        for begin in range(0, int(order.numel()), plan.batch_size):
            batch = _batch(
                train,
                order[begin : begin + plan.batch_size],
                plan.depth,
                embed,
                full_to_reduced,
                heads.output.dtype,
            )
            loss = _loss(heads, batch, plan)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
            optimiser.step()
            schedule.step()
            report.advance()
        heads.eval()
        accuracy, chain = evaluate(heads, test, embed, full_to_reduced)
        heads.train()
        state["epoch"] += 1
        state["history"].append(
            {
                "epoch": state["epoch"],
                "loss": round(float(loss.detach()), 4),
                "held_out_accuracy": [round(a, 4) for a in accuracy],
                "chain_acceptance": round(chain, 3),
                "seconds": round(time.perf_counter() - epoch_began, 1),
            }
        )
        if chain > state["best_score"]:
            state["best_score"] = chain
            state["best"] = {k: v.clone() for k, v in heads.state_dict().items()}
            state["best_epoch"] = state["epoch"]
        elif state["epoch"] - state.get("best_epoch", 0) >= plan.patience:
            state["stopped"] = True  # held-out acceptance stopped improving: overfitting
        torch.save(
            {
                "heads": heads.state_dict(),
                "optimiser": optimiser.state_dict(),
                "schedule": schedule.state_dict(),
                "state": state,
            },
            checkpoint,
        )
    if state["best"] is not None:
        heads.load_state_dict(state["best"])
    heads.eval()
    best: dict[str, Any] = next(
        (h for h in state["history"] if h["epoch"] == state.get("best_epoch")),
        {"held_out_accuracy": [0.0] * plan.depth, "chain_acceptance": 1.0},
    )
    return heads, KindResult(
        kind=kind,
        accuracy=list(best["held_out_accuracy"]),
        chain_acceptance=float(best["chain_acceptance"]),
        epochs=state["epoch"],
        seconds=time.perf_counter() - started,
        history=state["history"],
    )


def with_depth(plan: TrainPlan, depth: int) -> TrainPlan:
    """`plan` training `depth` heads."""
    return replace(plan, depth=depth)


def train_model_heads(
    name: str,
    models_dir: Path,
    prompts: Sequence[SeedPrompt],
    plan: TrainPlan,
    *,
    device: str = "auto",
    progress: TrainingProgress | None = None,
    force: bool = False,
) -> dict[HeadKind, HeadsMetadata]:
    """Load the target named `name` (as in an engine config) in float32 and train both
    kinds of heads for it into the models directory."""
    from engine.heads.model import heads_root, model_identity, model_key
    from engine.loading import load_causal_lm, resolve_model_dir

    model_dir = resolve_model_dir(name, models_dir=models_dir)
    model, tokenizer = load_causal_lm(model_dir, device=device, dtype="float32")
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return train_heads(
        model,
        tokenizer,
        prompts,
        plan,
        root=heads_root(models_dir, model_key(name, model_dir)),
        model_name=name,
        model_identity=model_identity(model_dir),
        progress=progress,
        force=force,
    )
