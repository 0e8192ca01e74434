"""`canaryd once` end to end on the fake engine: pairs run, stored, summarised; bad input
gets one clear line and a non-zero exit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.store import SqlStore

FAKE_ARMS = """
[arms.baseline]
kind = "fake"
[arms.speculative]
kind = "fake"
speculative = true
"""


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("CANARYD_CONFIG", raising=False)
    monkeypatch.delenv("CANARYD_STORAGE__URL", raising=False)
    return tmp_path


def config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "canaryd.toml"
    path.write_text(FAKE_ARMS + extra)
    return path


class TestOnceJson:
    def test_runs_stores_and_prints_the_documented_shape(self, env: Path) -> None:
        """--json prints run_id, a summary per category and every pair; the pairs are stored."""
        result = CliRunner().invoke(
            app, ["once", "--config", str(config(env)), "--pairs", "10", "--json"]
        )
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert set(data) >= {"run_id", "summary", "pairs"}
        assert len(data["pairs"]) == 10
        assert "all" in data["summary"]
        pair = data["pairs"][0]
        assert set(pair) >= {"prompt_id", "category", "baseline", "speculative", "scores"}
        for arm in ("baseline", "speculative"):
            assert set(pair[arm]) >= {"ttft_s", "tpot_s", "e2e_s", "output_tokens", "error"}
        assert set(pair["speculative"]) >= {
            "verify_steps",
            "draft_tokens",
            "accepted_tokens",
            "accepted_per_position",
        }
        assert "exact_match" in pair["scores"]
        categories = {p["category"] for p in data["pairs"]}
        assert len(categories) >= 8, "10 stratified pairs cover at least 8 categories"
        store = SqlStore.open(f"sqlite:///{env / 'data' / 'canaryd.db'}")
        try:
            stored = store.pairs(run_id=data["run_id"])
        finally:
            store.close()
        assert sorted(r.pair_id for r in stored) == sorted(p["pair_id"] for p in data["pairs"])

    def test_category_filter(self, env: Path) -> None:
        """--category runs only that category's prompts."""
        result = CliRunner().invoke(
            app, ["once", "-c", str(config(env)), "-n", "3", "--category", "math", "--json"]
        )
        assert result.exit_code == 0, result.output
        assert {p["category"] for p in json.loads(result.stdout)["pairs"]} == {"math"}

    def test_table_lists_categories_and_all(self, env: Path) -> None:
        """Without --json a table shows each category and the `all` row."""
        result = CliRunner().invoke(
            app, ["once", "-c", str(config(env)), "-n", "4", "--category", "code"]
        )
        assert result.exit_code == 0, result.output
        assert "code" in result.stdout and "all" in result.stdout
        assert "speedup" in result.stdout
        assert "ITL p99 b/s" in result.stdout and "fallback" in result.stdout


class TestOnceBadInput:
    def test_unknown_category(self, env: Path) -> None:
        """An unknown category is one line naming it and the known ones; exit 2."""
        result = CliRunner().invoke(app, ["once", "-c", str(config(env)), "--category", "poetry"])
        assert result.exit_code == 2
        assert "unknown category 'poetry'; known categories:" in result.stderr
        assert "Traceback" not in result.output

    def test_bad_prompt_file(self, env: Path) -> None:
        """A broken suite file is reported as file:line: reason."""
        bad = env / "bad.jsonl"
        bad.write_text('{"id": "x", "category": "qa"\n')
        path = config(env, f'[prompts]\nsuites = ["{bad}"]\n')
        result = CliRunner().invoke(app, ["once", "-c", str(path)])
        assert result.exit_code != 0
        assert f"{bad}:1:" in result.stderr
        assert "Traceback" not in result.output

    def test_bad_database_url(self, env: Path) -> None:
        """An unusable database URL is one line naming it; nothing runs."""
        path = config(env, '[storage]\nurl = "nosuchdb://x/y"\n')
        result = CliRunner().invoke(app, ["once", "-c", str(path)])
        assert result.exit_code != 0
        assert "nosuchdb" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1

    def test_bad_config_value(self, env: Path) -> None:
        """A bad config value names the file and key."""
        path = config(env, "[prompts]\nmax_tokens = 0\n")
        result = CliRunner().invoke(app, ["once", "-c", str(path)])
        assert result.exit_code == 2
        assert f"{path}: prompts.max_tokens:" in result.stderr

    def test_no_model_pulled(self, env: Path) -> None:
        """The default (embedded) arms with no pulled model say to run `canaryd models pull`."""
        result = CliRunner().invoke(app, ["once", "-n", "1"])
        assert result.exit_code != 0
        assert "canaryd models pull" in result.stderr
        assert "Traceback" not in result.output


THREE_ARMS = """
[arms.baseline]
kind = "fake"
[arms.hydra]
kind = "fake"
speculative = true
acceptance_rate = 0.9
[arms.medusa]
kind = "fake"
speculative = true
acceptance_rate = 0.3
[switch]
arm = "hydra"
"""


class TestOnceArms:
    def test_three_arms_json(self, env: Path) -> None:
        """Each prompt is one entry with the baseline once and every speculative arm under
        `arms`, each with its own scores; no single-arm `speculative`; the summary is the
        switch arm's, with every arm's beside it and the ratio between them."""
        path = env / "canaryd.toml"
        path.write_text(THREE_ARMS)
        result = CliRunner().invoke(app, ["once", "-c", str(path), "--pairs", "9", "--json"])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["switch_arm"] == "hydra"
        assert len(data["pairs"]) == 9
        for pair in data["pairs"]:
            assert "speculative" not in pair and "scores" not in pair
            assert sorted(pair["arm_order"]) == ["baseline", "hydra", "medusa"]
            assert set(pair["arms"]) == {"hydra", "medusa"}
            for arm in pair["arms"].values():
                assert arm["scores"]["exact_match"] is True
                assert arm["verify_steps"] > 0 and arm["acceptance_length"] >= 1.0
                assert arm["pair_id"] != pair["pair_id"] == pair["group_id"]
        summary = data["summary"]
        assert set(summary["arms"]) == {"hydra", "medusa"}
        assert summary["all"] == summary["arms"]["hydra"]["all"]
        hydra = summary["arms"]["hydra"]["all"]["acceptance_length_mean"]
        medusa = summary["arms"]["medusa"]["all"]["acceptance_length_mean"]
        assert hydra > medusa, "a higher acceptance rate drafts longer accepted runs"
        [ratio] = summary["ratios"]
        assert (ratio["arm"], ratio["over"]) == ("hydra", "medusa")
        assert ratio["acceptance_length_mean"] == pytest.approx(hydra / medusa)
        store = SqlStore.open(f"sqlite:///{env / 'data' / 'canaryd.db'}")
        try:
            stored = store.pairs(run_id=data["run_id"])
            run = store.runs_by_id([data["run_id"]])[data["run_id"]]
        finally:
            store.close()
        assert sorted(r.pair_id for r in stored) == sorted(
            arm["pair_id"] for pair in data["pairs"] for arm in pair["arms"].values()
        )
        assert {r.arm for r in stored} == {"hydra", "medusa"}
        assert set(run.info.arm_identities) == {"hydra", "medusa"}
        assert run.switch_arm == "hydra"

    def test_one_arm_keeps_its_keys_and_gains_arms(self, env: Path) -> None:
        """With one speculative arm every single-arm key stays, and `arms.speculative`
        repeats the arm's figures with its scores."""
        result = CliRunner().invoke(app, ["once", "-c", str(config(env)), "-n", "3", "--json"])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["summary"]["ratios"] == []
        assert data["summary"]["arms"]["speculative"]["all"] == data["summary"]["all"]
        for pair in data["pairs"]:
            entry = pair["arms"]["speculative"]
            assert entry["scores"] == pair["scores"] and entry["speedup"] == pair["speedup"]
            assert entry["pair_id"] == pair["pair_id"] == pair["group_id"]
            assert {k: v for k, v in entry.items() if k in pair["speculative"]} == pair[
                "speculative"
            ]

    def test_three_arms_table(self, env: Path) -> None:
        """Without --json a table per arm, the switch's marked, and the ratio line."""
        path = env / "canaryd.toml"
        path.write_text(THREE_ARMS)
        result = CliRunner().invoke(app, ["once", "-c", str(path), "-n", "3"])
        assert result.exit_code == 0, result.output
        assert "arm hydra (switch)" in result.stdout and "arm medusa" in result.stdout
        assert "hydra over medusa (all): acceptance_length_mean" in result.stdout


def category(speedup: float | None, pairs: int = 3, errors: tuple[int, int] = (0, 0)) -> Any:
    from canaryd.report import CategorySummary

    return CategorySummary(
        pairs=pairs, complete_pairs=pairs, speedup_median=speedup,
        acceptance_length_mean=None, acceptance_length_p50=None, acceptance_length_p90=None,
        acceptance_rate=None, fallback_rate=None, exact_match_rate=1.0, quality_delta_mean=0.0,
        baseline_e2e_p50_s=None, baseline_e2e_p99_s=None, speculative_e2e_p50_s=None,
        speculative_e2e_p99_s=None, baseline_itl_p99_s=None, speculative_itl_p99_s=None,
        baseline_tokens_per_s=None, speculative_tokens_per_s=None,
        baseline_errors=errors[0], speculative_errors=errors[1],
    )  # fmt: skip


class TestOnceVerdictSentences:
    def test_says_where_speculation_paid_off_and_where_it_did_not(self) -> None:
        """Categories above 1× are named as paying off, the others as not, with their
        figures, and the last sentence points at the gates that judge continuously."""
        from canaryd.cli.once import verdict_sentences

        lines = verdict_sentences(
            {"translation": category(1.7), "qa": category(0.88), "all": category(1.1, pairs=6)}
        )
        assert lines[0] == "Speculation paid off on these pairs in translation (1.70×)."
        assert lines[1].startswith("It did not in qa (0.88×)")
        assert "These are 6 pair(s)" in lines[-1] and "gates decide" in lines[-1]

    def test_names_more_speculative_failures_and_empty_runs(self) -> None:
        """A category where the speculative arm failed more is named; with no completed
        pair there is no speedup to claim."""
        from canaryd.cli.once import verdict_sentences

        lines = verdict_sentences({"math": category(None, errors=(0, 2))})
        assert lines[0].startswith("No pair completed on both arms")
        assert "math (2 vs 0)" in lines[1]

    def test_the_table_ends_with_the_sentences(self, env: Path, tmp_path: Path) -> None:
        """`canaryd once` prints the sentences under its table."""
        result = CliRunner().invoke(
            app, ["once", "--pairs", "2", "--config", str(config(tmp_path))]
        )
        assert result.exit_code == 0, result.output
        words = " ".join(result.stdout.split())
        assert "its gates decide" in words
