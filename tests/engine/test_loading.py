"""Loading a model for the in-process engine: paths, GGUF caching, device and dtype."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from structlog.testing import capture_logs

from canaryd import paths
from engine.errors import EngineConfigError, ModelNotFoundError
from engine.loading import load_causal_lm, resolve_device, resolve_dtype, resolve_model_dir
from engine.provision import EMBEDDED, require_embedded_model
from engine.testing import tiny_llama

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="host has CUDA")


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny Llama whose tokenizer has no pad token (as many real ones lack)."""
    directory = tmp_path_factory.mktemp("tiny")
    model, tokenizer = tiny_llama()
    tokenizer.pad_token = None
    model.save_pretrained(str(directory), safe_serialization=True)
    tokenizer.save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module")
def embedded_dir() -> Path:
    """The shared embedded model (`make test` pulls it before pytest runs)."""
    try:
        return require_embedded_model(paths.models_dir())
    except ModelNotFoundError as exc:
        pytest.fail(f"{exc} (`make test` pulls it before pytest)")


class TestResolveDevice:
    def test_auto_picks_cuda_only_when_present(self) -> None:
        """`auto` is cuda exactly when torch sees a CUDA device, else cpu."""
        expected = "cuda" if torch.cuda.is_available() else "cpu"
        assert resolve_device("auto").type == expected

    @needs_no_cuda
    def test_cuda_without_cuda_falls_back_to_cpu_with_a_warning(self) -> None:
        """Asking for cuda on a CPU-only host gives cpu and logs one warning."""
        with capture_logs() as logs:
            device = resolve_device("cuda")
        assert device.type == "cpu"
        assert [entry["event"] for entry in logs] == ["cuda_unavailable_using_cpu"]
        assert logs[0]["log_level"] == "warning"

    def test_unknown_device_is_a_config_error(self) -> None:
        """A device name outside auto/cpu/cuda is refused with the key and the choices."""
        with pytest.raises(EngineConfigError) as caught:
            resolve_device("tpu")
        assert (
            str(caught.value) == "engine config device: 'tpu' is not one of auto, cpu, cuda, cuda:N"
        )


class TestResolveDtype:
    def test_auto_on_cpu_is_float32(self) -> None:
        """`auto` on the CPU is float32."""
        assert resolve_dtype("auto", torch.device("cpu")) is torch.float32

    @pytest.mark.parametrize(
        ("name", "expected"),
        [("bf16", torch.bfloat16), ("float16", torch.float16), ("FP32", torch.float32)],
    )
    def test_explicit_names_are_accepted(self, name: str, expected: torch.dtype) -> None:
        """Full and short dtype names, in any case, map to the torch dtype."""
        assert resolve_dtype(name, torch.device("cpu")) is expected

    def test_unknown_dtype_is_a_config_error(self) -> None:
        """An unknown dtype is refused naming the key and the value."""
        with pytest.raises(EngineConfigError, match=r"^engine config dtype: 'int3' is not one of"):
            resolve_dtype("int3", torch.device("cpu"))


class TestResolveModelDir:
    def test_missing_path_names_the_path(self, tmp_path: Path) -> None:
        """A path that does not exist is a ModelNotFoundError naming it."""
        missing = tmp_path / "no-such-model"
        with pytest.raises(ModelNotFoundError) as caught:
            resolve_model_dir(missing)
        assert str(caught.value) == f"no model at {str(missing)!r}: no such file or directory"
        assert caught.value.path == missing

    def test_directory_without_config_is_not_a_model(self, tmp_path: Path) -> None:
        """A directory lacking config.json is refused with that reason."""
        with pytest.raises(ModelNotFoundError, match=r"no config\.json"):
            resolve_model_dir(tmp_path)

    def test_embedded_alias_without_models_dir_is_a_config_error(self) -> None:
        """The embedded alias cannot be resolved unless the models directory is given."""
        with pytest.raises(EngineConfigError, match="needs the models directory"):
            resolve_model_dir("embedded")

    @pytest.mark.parametrize("alias", ["embedded", EMBEDDED.name])
    def test_embedded_alias_before_a_pull_says_to_pull(self, tmp_path: Path, alias: str) -> None:
        """Both aliases of the embedded model point at `canaryd models pull` when absent."""
        with pytest.raises(ModelNotFoundError, match=r"run `canaryd models pull`$"):
            resolve_model_dir(alias, models_dir=tmp_path)

    def test_gguf_without_a_cache_is_a_config_error(self, tmp_path: Path) -> None:
        """A GGUF needs somewhere to cache its conversion."""
        gguf = tmp_path / "model.gguf"
        gguf.write_bytes(b"GGUF")
        with pytest.raises(EngineConfigError, match="pass a cache_dir"):
            resolve_model_dir(gguf)

    def test_other_file_is_not_a_model(self, tmp_path: Path) -> None:
        """A file that is not a GGUF is refused."""
        other = tmp_path / "weights.bin"
        other.write_bytes(b"")
        with pytest.raises(ModelNotFoundError, match=r"expected a model directory or a \.gguf"):
            resolve_model_dir(other)


class TestLoadCausalLm:
    def test_loads_a_model_directory_in_eval_mode_with_a_pad_token(
        self, tiny_model_dir: Path
    ) -> None:
        """A transformers directory loads on cpu in float32, eval mode, pad token = eos."""
        model, tokenizer = load_causal_lm(tiny_model_dir, device="cpu")
        assert not model.training
        assert model.dtype is torch.float32
        assert model.device.type == "cpu"
        assert tokenizer.pad_token == tokenizer.eos_token
        assert model.generation_config.pad_token_id is not None

    def test_explicit_dtype_is_honoured(self, tiny_model_dir: Path) -> None:
        """dtype="bfloat16" gives a bfloat16 model."""
        model, _ = load_causal_lm(tiny_model_dir, device="cpu", dtype="bfloat16")
        assert model.dtype is torch.bfloat16

    def test_bad_dtype_fails_before_loading(self, tiny_model_dir: Path) -> None:
        """An invalid dtype is a config error, not a transformers traceback."""
        with pytest.raises(EngineConfigError):
            load_causal_lm(tiny_model_dir, dtype="float8")


@pytest.mark.model
class TestLoadEmbeddedModel:
    def test_embedded_alias_loads_and_generates(self, embedded_dir: Path) -> None:
        """`embedded` loads the pulled model, which answers a chat prompt greedily."""
        model, tokenizer = load_causal_lm("embedded", device="cpu", models_dir=embedded_dir.parent)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        inputs = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            output = model.generate(**inputs, max_new_tokens=12, do_sample=False)
        answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :])
        assert "Paris" in answer

    def test_gguf_is_converted_once_then_loaded_from_the_cache(
        self, embedded_dir: Path, tmp_path: Path
    ) -> None:
        """A .gguf path converts into the cache keyed by sha256; the next load reuses it."""
        gguf = embedded_dir / EMBEDDED.gguf_filename
        load_causal_lm(gguf, device="cpu", cache_dir=tmp_path)
        cached = tmp_path / EMBEDDED.gguf_sha256
        assert (cached / "model.safetensors").is_file()
        assert [p.name for p in tmp_path.iterdir()] == [EMBEDDED.gguf_sha256]
        converted_at = (cached / "model.safetensors").stat().st_mtime_ns
        started = time.monotonic()
        model, _ = load_causal_lm(gguf, device="cpu", cache_dir=tmp_path)
        assert time.monotonic() - started < 10.0
        assert (cached / "model.safetensors").stat().st_mtime_ns == converted_at
        assert not model.training
