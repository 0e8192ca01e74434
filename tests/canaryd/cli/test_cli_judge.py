"""`canaryd judge` through the CLI runner against two loopback OpenAI-compatible servers:
exit 0 on a healthy candidate, 1 on a broken one, 3 (or `--undecided-exit`) when the
budget ends undecided, 2 on bad input; the pairs are stored as a run of kind `judge`.
Only liveness enforces (5 pairs decide), so the outcomes do not rest on timing. A
candidate that streams for ever fails each generation at its byte cap, and a run without
`--max-minutes` still ends by `DEFAULT_MAX_MINUTES`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.cli import judge as judge_command
from canaryd.cli.app import app
from canaryd.store import SqlStore
from engine.sse import output_byte_cap, over_output_cap
from engine.types import ErrorKind
from tests.support.configs import LIVENESS_ONLY
from tests.support.servers import Behaviour, MisbehavingServer


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
    for name in ("CANARYD_CONFIG", "CANARYD_STORAGE__URL", "CANARYD_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "canaryd.toml"
    path.write_text(LIVENESS_ONLY + f'[storage]\nurl = "sqlite:///{tmp_path / "judge.db"}"\n')
    return path


@pytest.fixture
def servers() -> Iterator[tuple[MisbehavingServer, MisbehavingServer]]:
    with MisbehavingServer() as baseline, MisbehavingServer() as candidate:
        yield baseline, candidate


def judge(config: Path, baseline: str, candidate: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        app,
        ["judge", "--config", str(config), "--baseline", baseline, "--candidate", candidate, *args],
    )
    return result.exit_code, result.output


def runs(config: Path) -> list[tuple[str, int]]:
    with SqlStore.open(f"sqlite:///{config.parent / 'judge.db'}") as store:
        return [(run.info.kind, len(store.pairs(run_id=run.info.run_id))) for run in store.runs()]


class TestJudge:
    def test_a_healthy_candidate_passes_early_and_is_stored(
        self, env: Path, servers: tuple[MisbehavingServer, MisbehavingServer]
    ) -> None:
        """Exit 0 with PASS once the enforce gates decide (5 pairs of the 20 allowed), the
        summary table and the run to report; both servers are asked for `--model`."""
        baseline, candidate = servers
        code, output = judge(env, baseline.url, candidate.url, "--pairs", "20", "--model", "m1")
        assert code == 0, output
        assert "verdict: PASS — every enforce gate PASSed on 5 pairs of judge run" in output
        assert "liveness" in output and "decided after" in output
        assert "canaryd report --run" in output
        assert runs(env) == [("judge", 5)]
        asked = [r for r in baseline.requests + candidate.requests if "messages" in r]
        assert asked and {r["model"] for r in asked} == {"m1"}

    def test_a_broken_candidate_fails(
        self, env: Path, servers: tuple[MisbehavingServer, MisbehavingServer]
    ) -> None:
        """A candidate that answers 500 to everything: exit 1, FAIL naming the gate; --json
        prints the verdict, its evidence and the run."""
        baseline, candidate = servers
        candidate.default = Behaviour(fault="status", status=500)
        code, output = judge(env, baseline.url, candidate.url, "--pairs", "20", "--json")
        assert code == 1, output
        body = json.loads(output)
        assert (body["verdict"], body["pairs"]) == ("FAIL", 5)
        assert body["reason"].startswith("liveness FAILed on 5 pairs of judge run")
        assert body["decided_after_s"] is not None and body["drift_judged"] is False
        assert any(g["name"] == "liveness" and g["state"] == "FAIL" for g in body["gates"])
        assert runs(env) == [("judge", 5)]

    def test_an_undecided_budget_exits_3_or_as_asked(
        self, env: Path, servers: tuple[MisbehavingServer, MisbehavingServer]
    ) -> None:
        """Two pairs decide nothing: NODATA, exit 3; `--undecided-exit 1` maps it to 1
        for a job runner that knows only pass and fail."""
        baseline, candidate = servers
        code, output = judge(env, baseline.url, candidate.url, "--pairs", "2")
        assert code == 3, output
        assert "verdict: NODATA" in output and "not decided within the budget" in output
        code, output = judge(
            env, baseline.url, candidate.url, "--pairs", "2", "--undecided-exit", "1"
        )
        assert code == 1, output

    def test_an_endless_candidate_fails_each_generation_at_its_byte_cap(
        self, env: Path, servers: tuple[MisbehavingServer, MisbehavingServer]
    ) -> None:
        """A candidate streaming well-formed content for ever (~30 MB/s): each of its
        generations ends `invalid_output` at `output_byte_cap(max_tokens)`, well inside
        the 3 s generation timeout, and liveness FAILs on 5 pairs: exit 1 in seconds."""
        env.write_text(
            env.read_text().replace("max_tokens = 8\n", "max_tokens = 8\ntimeout_s = 3\n")
        )
        baseline, candidate = servers
        candidate.default = Behaviour(fault="endless", token_delay_s=0.002)
        started = time.monotonic()
        code, output = judge(env, baseline.url, candidate.url, "--pairs", "20", "--json")
        wall_s = time.monotonic() - started
        assert code == 1, output
        body = json.loads(output)
        assert (body["verdict"], body["pairs"]) == ("FAIL", 5)
        assert body["elapsed_s"] < 5 * 1.0 and wall_s < 30
        with SqlStore.open(f"sqlite:///{env.parent / 'judge.db'}") as store:
            records = store.pairs(run_id=body["run_id"])
        assert len(records) == 5
        for record in records:
            assert record.baseline.ok
            assert record.speculative.error is ErrorKind.INVALID_OUTPUT
            assert over_output_cap(record.speculative), record.speculative.error_detail
            assert f"the cap is {output_byte_cap(8)} " in record.speculative.error_detail

    def test_without_max_minutes_the_run_ends_by_the_default_bound(
        self,
        env: Path,
        servers: tuple[MisbehavingServer, MisbehavingServer],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """`--pairs 50` without `--max-minutes` still stops at `DEFAULT_MAX_MINUTES` (60,
        said in --help; 1.5 s here, against a candidate taking 0.4 s a pair): the pair
        running then finishes, the verdict is undecided, and the bound is stored."""
        assert "at most 60 minutes whatever --pairs says" in " ".join(
            CliRunner().invoke(app, ["judge", "--help"]).output.replace("│", " ").split()
        )
        monkeypatch.setattr(judge_command, "DEFAULT_MAX_MINUTES", 0.025)
        baseline, candidate = servers
        candidate.default = Behaviour(tokens=8, token_delay_s=0.05)
        code, output = judge(env, baseline.url, candidate.url, "--pairs", "50", "--json")
        assert code == 3, output
        body = json.loads(output)
        assert body["verdict"] == "NODATA" and 1 <= body["pairs"] < 5
        assert body["elapsed_s"] < 1.5 + 1.0
        with SqlStore.open(f"sqlite:///{env.parent / 'judge.db'}") as store:
            [run] = store.runs()
        assert run.info.config["judge"] == {"pairs": 50, "max_minutes": 0.025}

    @pytest.mark.parametrize(
        ("args", "says"),
        [
            (["--baseline", "http://127.0.0.1:9"], "give both --baseline and --candidate"),
            (
                ["--baseline", "127.0.0.1:9", "--candidate", "http://127.0.0.1:9"],
                "--baseline '127.0.0.1:9': expected an http:// or https:// URL",
            ),
            (["--pairs", "3", "--max-minutes", "1"], "give --pairs or --max-minutes, not both"),
        ],
    )
    def test_bad_input_is_exit_2_with_one_line(self, env: Path, args: list[str], says: str) -> None:
        """A usage problem is exit 2 and one `canaryd: error:` line, before any pair."""
        result = CliRunner().invoke(app, ["judge", "--config", str(env), *args])
        assert result.exit_code == 2
        assert f"canaryd: error: {says}" in result.output
