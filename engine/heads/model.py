"""The draft-head networks and their files on disk.

Head d (1 … depth) proposes the token d places after the target's own next token: from
the target's last hidden state h alone (`independent`, Medusa-style), or from h and the
embeddings of the tokens already on the drafted path, the target's own next token first
(`causal`, Hydra-style). Each head is a residual block, initialised to the identity, on
a shared output layer: the target's output rows for a reduced vocabulary (the tokens the
target emitted in the training data), frozen and copied once at load, so a head call is
a small matrix product and its proposals map back to full token ids through `vocab_ids`.

Trained heads live under ``<models dir>/heads/<model>/<kind>/`` as safetensors plus a
JSON metadata file that records the kind, depth, vocabulary, the identity of the target
weights they were trained on, the training figures and the weights' sha256, which is
checked on every load.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from torch import nn

from engine.errors import EngineConfigError, HeadsFileError, HeadsNotTrainedError
from engine.provision import EMBEDDED, EMBEDDED_ALIASES, read_manifest, sha256_file

HeadKind = Literal["causal", "independent"]
HEAD_KINDS: tuple[HeadKind, ...] = get_args(HeadKind)
FORMAT_VERSION = 1
WEIGHTS_NAME = "heads.safetensors"
METADATA_NAME = "heads.json"
_HEADS_SUBDIR = "heads"


def _unit_rms(x: torch.Tensor) -> torch.Tensor:
    """Parameter-free RMS normalisation: hidden states and embeddings enter a head on
    one scale, whatever the target's embedding magnitudes."""
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)


class _Head(nn.Module):
    """z = h + SiLU(W x) (+ further residual blocks on z); zero weights make z = h."""

    def __init__(self, hidden_size: int, inputs: int, layers: int, vocab: int) -> None:
        super().__init__()
        self.proj = nn.Linear(inputs * hidden_size, hidden_size)
        self.blocks = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(layers - 1))
        self.vocab_bias = nn.Parameter(torch.zeros(vocab))
        for linear in (self.proj, *self.blocks):
            assert isinstance(linear, nn.Linear)
            nn.init.zeros_(linear.weight)
            nn.init.zeros_(linear.bias)

    def forward(self, features: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        z = hidden + nn.functional.silu(self.proj(features))
        for block in self.blocks:
            z = z + nn.functional.silu(block(z))
        return z


class DraftHeads(nn.Module):
    """`depth` heads of one kind over a reduced vocabulary.

    `output_weight` is the target's full output matrix (vocab × hidden); the rows of
    `vocab_ids` are copied into a frozen, unsaved buffer. Embeddings of path tokens are
    the caller's (the target's input embeddings), so the heads hold no copy of them.
    """

    vocab_ids: torch.Tensor  # (V,) full token id of each reduced-vocabulary entry
    output: torch.Tensor  # (V, H) the target's output rows for them, frozen

    def __init__(
        self,
        *,
        kind: HeadKind,
        depth: int,
        vocab_ids: torch.Tensor,
        output_weight: torch.Tensor,
        layers: int = 1,
    ) -> None:
        super().__init__()
        if kind not in HEAD_KINDS:
            raise ValueError(f"head kind {kind!r} is not one of {HEAD_KINDS}")
        self.kind: HeadKind = kind
        self.depth = depth
        self.layers = layers
        self.full_vocab_size, self.hidden_size = (int(n) for n in output_weight.shape)
        ids = vocab_ids.to(device=output_weight.device, dtype=torch.long)
        self.register_buffer("vocab_ids", ids)
        self.register_buffer("output", output_weight.detach()[ids].clone(), persistent=False)
        self.heads = nn.ModuleList(
            _Head(
                self.hidden_size,
                1 if kind == "independent" else d + 1,
                layers,
                int(ids.numel()),
            )
            for d in range(1, depth + 1)
        )
        self.to(dtype=output_weight.dtype)

    @property
    def causal(self) -> bool:
        return self.kind == "causal"

    @property
    def reduced_vocab_size(self) -> int:
        return int(self.vocab_ids.numel())

    def extra_bytes(self) -> int:
        """Memory the heads add to the target: their parameters and the output rows."""
        tensors = [*self.parameters(), *self.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def logits(
        self, depth: int, hidden: torch.Tensor, path_embeddings: torch.Tensor | None
    ) -> torch.Tensor:
        """Reduced-vocabulary logits of head `depth` (1-based) for `n` drafting points.

        `hidden` is (n, H); `path_embeddings` (n, depth, H) holds the embeddings of the
        target's next token and the drafted tokens before this depth (causal heads only).
        """
        head = self.heads[depth - 1]
        assert isinstance(head, _Head)
        h = _unit_rms(hidden)
        if self.causal:
            if path_embeddings is None or path_embeddings.shape[1] != depth:
                raise ValueError(f"causal head {depth} needs {depth} path embeddings")
            features = torch.cat((h, _unit_rms(path_embeddings).flatten(1)), dim=1)
        else:
            features = h
        z = head(features, hidden)
        out: torch.Tensor = z @ self.output.T + head.vocab_bias
        return out

    def all_logits(self, hidden: torch.Tensor, path_embeddings: torch.Tensor) -> torch.Tensor:
        """Every head's logits at once, teacher-forced: (n, depth, V) from hidden (n, H)
        and the true path's embeddings (n, depth, H); for training and evaluation."""
        return torch.stack(
            [
                self.logits(d, hidden, path_embeddings[:, :d] if self.causal else None)
                for d in range(1, self.depth + 1)
            ],
            dim=1,
        )

    def trained_state(self) -> dict[str, torch.Tensor]:
        """What is saved: the heads' parameters and vocabulary (not the copied rows)."""
        return {key: value.detach().contiguous() for key, value in self.state_dict().items()}


def initialised_heads(
    model: Any,
    kind: HeadKind,
    depth: int,
    *,
    vocab_ids: torch.Tensor | None = None,
    layers: int = 1,
    seed: int = 0,
    scale: float = 0.0,
) -> DraftHeads:
    """Fresh heads for `model` (a transformers causal LM): identity heads when `scale`
    is 0, random ones (weights ~ N(0, scale²)) otherwise, e.g. for tests of the loop."""
    output_weight = model.get_output_embeddings().weight
    ids = torch.arange(output_weight.shape[0]) if vocab_ids is None else vocab_ids
    heads = DraftHeads(
        kind=kind, depth=depth, vocab_ids=ids, output_weight=output_weight, layers=layers
    )
    if scale > 0:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for parameter in heads.parameters():
                noise = torch.randn(parameter.shape, generator=generator) * scale
                parameter.copy_(noise.to(parameter.dtype))
    return heads


# -- files ------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadsMetadata:
    """What `heads.json` records beside the weights."""

    kind: HeadKind
    depth: int
    layers: int
    hidden_size: int
    vocab_size: int
    reduced_vocab_size: int
    model: str  # the target's name in config (`embedded`, a directory)
    model_identity: str  # what identifies the target's weights (see `model_identity`)
    sha256: str  # of the weights file
    created_at: str = ""
    training: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION


def model_identity(model_dir: Path) -> str:
    """What identifies a target's weights without hashing gigabytes: the embedded
    model's GGUF sha256 from its manifest; for any other directory a sha256 over its
    config.json and the names and sizes of its weight files."""
    manifest = read_manifest(model_dir, EMBEDDED)
    if manifest is not None:
        return f"gguf-sha256:{manifest['gguf']['sha256']}"
    digest = hashlib.sha256((model_dir / "config.json").read_bytes())
    for weights in sorted(model_dir.glob("*.safetensors")) + sorted(model_dir.glob("*.bin")):
        digest.update(f"{weights.name}:{weights.stat().st_size};".encode())
    return f"files-sha256:{digest.hexdigest()}"


def model_key(model: str, model_dir: Path) -> str:
    """The directory name under `heads/` for a target named `model` in config."""
    return EMBEDDED.name if model in EMBEDDED_ALIASES else model_dir.name


def heads_root(models_dir: Path, key: str) -> Path:
    return Path(models_dir) / _HEADS_SUBDIR / key


def heads_dir(models_dir: Path, key: str, kind: HeadKind) -> Path:
    return heads_root(models_dir, key) / kind


def save_heads(heads: DraftHeads, directory: Path, metadata: HeadsMetadata) -> HeadsMetadata:
    """Write weights, then metadata (with the weights' sha256), each via a rename."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    staged = directory / f".{WEIGHTS_NAME}.tmp"
    save_file({k: v.cpu() for k, v in heads.trained_state().items()}, str(staged))
    staged.replace(directory / WEIGHTS_NAME)
    final = HeadsMetadata(**(asdict(metadata) | {"sha256": sha256_file(directory / WEIGHTS_NAME)}))
    staged_meta = directory / f".{METADATA_NAME}.tmp"
    staged_meta.write_text(json.dumps(asdict(final), indent=2) + "\n", encoding="utf-8")
    staged_meta.replace(directory / METADATA_NAME)
    return final


def read_metadata(directory: Path) -> HeadsMetadata | None:
    """The metadata of trained heads in `directory`, or None when there are none."""
    try:
        raw = json.loads((directory / METADATA_NAME).read_text(encoding="utf-8"))
        return HeadsMetadata(**raw)
    except (OSError, ValueError, TypeError):
        return None


def load_heads(
    directory: Path, kind: HeadKind, model: Any, *, identity: str | None
) -> tuple[DraftHeads, HeadsMetadata]:
    """Heads of `kind` from `directory` for `model`; the weights' sha256, the target's
    identity (unless None) and its shape must match the metadata."""
    from safetensors.torch import load_file

    metadata = read_metadata(directory)
    weights = directory / WEIGHTS_NAME
    if metadata is None or not weights.is_file():
        raise HeadsNotTrainedError(directory, kind)
    fix = "run `canaryd models train-heads` again"
    if metadata.format_version != FORMAT_VERSION or metadata.kind != kind:
        raise HeadsFileError(directory, f"format {metadata.format_version} / kind {metadata.kind}")
    actual = sha256_file(weights)
    if actual != metadata.sha256:
        raise HeadsFileError(weights, f"sha256 {actual} is not {metadata.sha256}; {fix}")
    if identity is not None and metadata.model_identity != identity:
        raise HeadsFileError(
            directory, f"trained on {metadata.model_identity}, the model is {identity}; {fix}"
        )
    output_weight = model.get_output_embeddings().weight
    if tuple(output_weight.shape) != (metadata.vocab_size, metadata.hidden_size):
        raise HeadsFileError(directory, f"trained for another model shape; {fix}")
    state = load_file(str(weights), device=str(output_weight.device))
    heads = DraftHeads(
        kind=kind,
        depth=metadata.depth,
        vocab_ids=state["vocab_ids"],
        output_weight=output_weight,
        layers=metadata.layers,
    )
    heads.load_state_dict(
        {k: v.to(output_weight.dtype) if v.is_floating_point() else v for k, v in state.items()}
    )
    heads.eval()
    return heads, metadata


def trained_heads_location(name: str, models_dir: Path | None, kind: HeadKind) -> tuple[Path, str]:
    """Where heads of `kind` for the target named `name` in config live, and the
    identity of that target's weights."""
    from engine.loading import resolve_model_dir

    if models_dir is None:
        raise EngineConfigError("speculative.method", "draft_heads needs the models directory")
    model_dir = resolve_model_dir(name, models_dir=models_dir)
    return heads_dir(models_dir, model_key(name, model_dir), kind), model_identity(model_dir)


def load_trained_heads(
    model: Any, name: str, models_dir: Path | None, kind: HeadKind
) -> tuple[DraftHeads, HeadsMetadata]:
    """The trained heads of `kind` for `model`, named `name` in config."""
    directory, identity = trained_heads_location(name, models_dir, kind)
    return load_heads(directory, kind, model, identity=identity)


def cache_argument(model: Any) -> str:
    """The name of a transformers model's KV cache argument: `cache` from
    transformers 5, `past_key_values` before."""
    import inspect

    parameters = inspect.signature(model.base_model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"
