"""Loading a causal language model and its tokenizer for the in-process engine.

A model is named by a transformers model directory, a `.gguf` file (de-quantised once
and cached as safetensors, keyed by the file's sha256) or the embedded model's alias
(`embedded`, `smollm2-135m-instruct`). Device and dtype default to what runs well where
we are, and a CUDA request on a host without CUDA falls back to CPU with a warning
rather than failing the daemon.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import structlog

from engine.errors import EngineConfigError, ModelNotFoundError
from engine.provision import (
    EMBEDDED_ALIASES,
    convert_gguf,
    dtype_kwargs,
    require_embedded_model,
    sha256_file,
)

log = structlog.get_logger(__name__)

DTYPE_NAMES = {
    "float32": "float32",
    "fp32": "float32",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}
_GGUF_CACHE_SUBDIR = "gguf-cache"


def load_causal_lm(
    path: str | Path,
    *,
    device: str = "auto",
    dtype: str = "auto",
    models_dir: Path | None = None,
    cache_dir: Path | None = None,
) -> tuple[Any, Any]:
    """Load `(model, tokenizer)` in eval mode, the tokenizer with a pad token.

    `models_dir` resolves the embedded model's aliases; `cache_dir` (default
    `models_dir/gguf-cache`) holds safetensors converted from `.gguf` files.
    """
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    model_dir = resolve_model_dir(path, models_dir=models_dir, cache_dir=cache_dir)

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    # transformers draws a "Loading weights" progress bar on stderr; canaryd logs the
    # load itself (model_loaded), and a bar in journald or a piped log is noise.
    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), **dtype_kwargs(torch_dtype))
    model.to(torch_device)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    log.info(
        "model_loaded",
        model=str(model_dir),
        device=str(torch_device),
        dtype=str(torch_dtype).removeprefix("torch."),
    )
    return model, tokenizer


def resolve_model_dir(
    path: str | Path, *, models_dir: Path | None = None, cache_dir: Path | None = None
) -> Path:
    """The transformers model directory that `path` names, converting a GGUF if needed."""
    if str(path) in EMBEDDED_ALIASES:
        if models_dir is None:
            raise EngineConfigError("model", f"{str(path)!r} needs the models directory")
        return require_embedded_model(models_dir)
    location = Path(path).expanduser()
    if location.is_dir():
        if not (location / "config.json").is_file():
            raise ModelNotFoundError(
                location, hint="not a transformers model directory (no config.json)"
            )
        return location
    if location.is_file() and location.suffix == ".gguf":
        if cache_dir is None:
            if models_dir is None:
                raise EngineConfigError("model", f"{str(path)!r} is a GGUF: pass a cache_dir")
            cache_dir = models_dir / _GGUF_CACHE_SUBDIR
        return converted_gguf_dir(location, cache_dir)
    if location.is_file():
        raise ModelNotFoundError(location, hint="expected a model directory or a .gguf file")
    raise ModelNotFoundError(location, hint="no such file or directory")


def converted_gguf_dir(gguf_path: Path, cache_dir: Path) -> Path:
    """The safetensors conversion of `gguf_path` in `cache_dir`, converting on first use.

    Keyed by the GGUF's sha256, so a changed file is converted again; built in a
    temporary directory and renamed into place so a crash leaves no half conversion.
    """
    cached = cache_dir / sha256_file(gguf_path)
    if (cached / "config.json").is_file() and (cached / "model.safetensors").is_file():
        return cached
    cache_dir.mkdir(parents=True, exist_ok=True)
    log.info("gguf_converting", gguf=str(gguf_path), cache=str(cached))
    staging = Path(tempfile.mkdtemp(prefix=f".{cached.name}.tmp-", dir=cache_dir))
    try:
        convert_gguf(gguf_path, staging)
        try:
            staging.rename(cached)
        except OSError:
            # A concurrent loader published the same conversion first; use theirs.
            if not (cached / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return cached


def resolve_device(device: str) -> Any:
    """`auto` → cuda when available, else cpu; cuda without CUDA → cpu with a warning."""
    import torch

    name = device.strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        try:
            requested = torch.device(name)
        except RuntimeError as exc:
            raise EngineConfigError("device", f"{device!r} is not a device: {exc}") from exc
        if not torch.cuda.is_available():
            log.warning("cuda_unavailable_using_cpu", requested=device)
            return torch.device("cpu")
        if requested.index is not None and requested.index >= torch.cuda.device_count():
            raise EngineConfigError(
                "device", f"{device!r}: only {torch.cuda.device_count()} CUDA device(s)"
            )
        return requested
    raise EngineConfigError("device", f"{device!r} is not one of auto, cpu, cuda, cuda:N")


def resolve_dtype(dtype: str, device: Any) -> Any:
    """`auto` → float32 on CPU, bfloat16 on CUDA (float16 where bf16 is unsupported)."""
    import torch

    name = dtype.strip().lower()
    if name == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if name not in DTYPE_NAMES:
        choices = ", ".join(["auto", *DTYPE_NAMES])
        raise EngineConfigError("dtype", f"{dtype!r} is not one of {choices}")
    return getattr(torch, DTYPE_NAMES[name])


__all__ = [
    "converted_gguf_dir",
    "load_causal_lm",
    "resolve_device",
    "resolve_dtype",
    "resolve_model_dir",
]
