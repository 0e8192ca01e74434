"""`canaryd prompts validate` and `canaryd prompts list` through the CLI runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.paths import prompts_dir

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "prompts"
BROKEN = FIXTURES / "broken"

runner = CliRunner()


class TestValidateCommand:
    def test_shipped_suites_are_valid(self) -> None:
        """Validating the shipped prompts directory exits 0 and says how much it checked."""
        result = runner.invoke(app, ["prompts", "validate", str(prompts_dir())])
        assert result.exit_code == 0, result.output
        assert result.stdout.startswith("ok: 9 files, ")
        assert result.stdout.rstrip().endswith("prompts, no problems")

    def test_valid_files_and_mtbench(self) -> None:
        """Native and MT-Bench files validate together and the summary counts their prompts."""
        result = runner.invoke(
            app, ["prompts", "validate", str(FIXTURES / "valid"), str(FIXTURES / "question.jsonl")]
        )
        assert result.exit_code == 0, result.output
        assert result.stdout == "ok: 3 files, 10 prompts, no problems\n"

    def test_each_problem_on_its_own_line(self) -> None:
        """Problems go to stdout one per line, followed by a summary, and the exit code is 1."""
        path = BROKEN / "keys.jsonl"
        result = runner.invoke(app, ["prompts", "validate", str(path)])
        assert result.exit_code == 1
        assert result.stdout.splitlines() == [
            f"{path}:1: unknown key 'prompt'",
            f"{path}:2: missing key 'id'",
            f"{path}:3: missing key 'max_tokens'",
            f"{path}:4: duplicate id 'k-001' (first defined at line 1)",
            f"{path}:5: id must be a non-empty string",
            "5 problems in 1 file",
        ]

    def test_every_file_is_checked(self) -> None:
        """A valid file does not hide the problems of a broken one given after it."""
        good, empty = FIXTURES / "valid" / "small.jsonl", BROKEN / "empty.jsonl"
        result = runner.invoke(app, ["prompts", "validate", str(good), str(empty)])
        assert result.exit_code == 1
        assert result.stdout.splitlines() == [
            f"{empty}:1: empty file: no prompts",
            "1 problem in 2 files",
        ]

    def test_missing_path_is_a_problem(self, tmp_path: Path) -> None:
        """A path that does not exist is reported like any other problem and fails."""
        missing = tmp_path / "missing.jsonl"
        result = runner.invoke(app, ["prompts", "validate", str(missing)])
        assert result.exit_code == 1
        assert f"{missing}: no such file or directory" in result.stdout.splitlines()
        assert result.stdout.splitlines()[-1] == "1 problem in 1 file"

    def test_id_clash_between_files(self) -> None:
        """Two files that are valid alone but share an id fail together."""
        small, clash = FIXTURES / "valid" / "small.jsonl", BROKEN / "clash.jsonl"
        result = runner.invoke(app, ["prompts", "validate", str(small), str(clash)])
        assert result.exit_code == 1
        assert result.stdout.splitlines() == [
            f"{clash}:1: duplicate id 'small-001' (first defined at {small}:1)",
            "1 problem in 2 files",
        ]

    def test_path_is_required(self) -> None:
        """Without a path the command is a usage error: one line naming the argument."""
        result = runner.invoke(app, ["prompts", "validate"])
        assert result.exit_code == 2
        assert result.output == (
            "canaryd: error: missing argument PATH (see canaryd prompts validate --help)\n"
        )


class TestUnstorableText:
    def test_nul_and_lone_surrogates_are_refused_with_file_and_line(self, tmp_path: Path) -> None:
        """A NUL character (PostgreSQL refuses it) or a lone surrogate (not Unicode text) in
        a prompt is a problem at `file:line`, in `prompts validate` and at load."""
        path = tmp_path / "suite.jsonl"
        lines = [
            {"id": "ok", "category": "qa", "messages": [{"role": "user", "content": "hi"}]},
            {"id": "nul", "category": "qa", "messages": [{"role": "user", "content": "a\x00b"}]},
            {"id": "sur", "category": "qa", "messages": [{"role": "user", "content": "x\udc80"}]},
        ]
        path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
        result = runner.invoke(app, ["prompts", "validate", str(path)])
        assert result.exit_code == 1
        out = result.stdout.splitlines()
        assert out[0] == f"{path}:2: a NUL character (\\u0000) in the text: remove it"
        assert out[1].startswith(f"{path}:3: a lone surrogate ('\\udc80') in the text")

    def test_once_refuses_the_suite_before_running_a_pair(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`canaryd once` on such a suite exits 2 naming the line, and stores nothing."""
        path = tmp_path / "suite.jsonl"
        record = {"id": "nul", "category": "qa", "messages": [{"role": "user", "content": "\x00"}]}
        path.write_text(json.dumps(record) + "\n")
        config = tmp_path / "canaryd.toml"
        config.write_text(
            '[arms.baseline]\nkind = "fake"\n[arms.speculative]\nkind = "fake"\n'
            f'speculative = true\n[prompts]\nsuites = ["{path}"]\n'
        )
        monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
        result = runner.invoke(app, ["once", "--pairs", "1", "--config", str(config)])
        assert result.exit_code == 2
        assert f"{path}:1: a NUL character" in result.output
        assert not (tmp_path / "data" / "canaryd.db").exists()


class TestListCommand:
    def test_defaults_to_shipped_suites(self) -> None:
        """With no path the shipped suites are listed, one row per suite and category."""
        result = runner.invoke(app, ["prompts", "list"])
        assert result.exit_code == 0, result.output
        for category in (
            "multi_turn",
            "translation",
            "summarisation",
            "qa",
            "math",
            "rag",
            "code",
            "structured",
            "extraction",
        ):
            assert category in result.stdout
        assert "9 categories" in result.stdout

    def test_json_output(self) -> None:
        """`--json` prints each suite with its path, digest and prompts per category."""
        result = runner.invoke(app, ["prompts", "list", str(FIXTURES / "valid"), "--json"])
        assert result.exit_code == 0, result.output
        listing = json.loads(result.stdout)
        assert [entry["suite"] for entry in listing] == ["other", "small"]
        small = listing[1]
        assert small["path"] == str(FIXTURES / "valid" / "small.jsonl")
        assert small["prompts"] == 3
        assert small["categories"] == {"math": 1, "multi_turn": 1, "qa": 1}
        assert len(small["sha256"]) == 64

    def test_mtbench_file(self) -> None:
        """An MT-Bench question file lists under its sanitised categories."""
        result = runner.invoke(app, ["prompts", "list", str(FIXTURES / "question.jsonl"), "--json"])
        assert result.exit_code == 0, result.output
        (entry,) = json.loads(result.stdout)
        assert entry["categories"] == {
            "coding": 1,
            "extraction_rewriting": 2,
            "math": 2,
            "writing": 1,
        }

    def test_invalid_suite_is_one_error_line(self) -> None:
        """An invalid suite prints one `canaryd: error:` line on stderr and exits 2."""
        path = BROKEN / "keys.jsonl"
        result = runner.invoke(app, ["prompts", "list", str(path)])
        assert result.exit_code == 2
        assert result.stdout == ""
        assert result.stderr == (
            f"canaryd: error: {path}:1: unknown key 'prompt' "
            "(and 4 more; run `canaryd prompts validate`)\n"
        )
