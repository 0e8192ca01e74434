"""canaryd against a real llama.cpp server on loopback: llama-cpp-python's
OpenAI-compatible server, started twice on the embedded GGUF — plain, and with
`--draft_model prompt-lookup-decoding` — paired by the PairRunner through two
OpenAIEngine arms; and `canaryd judge` on them: undecided after three healthy pairs, and
FAIL by the quality gate on a third deployment served with the wrong chat template.

The server lives in its own venv, built by `make llamacpp` (.ci/llamacpp.sh); without
it these tests skip with that instruction, except under CI=true, where they fail.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.pairs.runner import PairParams, PairRunner
from canaryd.pairs.suites import load_default_suites
from canaryd.paths import models_dir
from engine.config import OpenAIEngineConfig
from engine.http import OpenAIEngine
from engine.provision import require_embedded_model
from engine.types import AcceptanceSource, ErrorKind, GenerationRequest, SamplingParams
from gates.config import QualityGateConfig
from gates.core import GateState
from gates.pairs.quality import quality_gate
from gates.stats.budget import DEFAULT_ARL0

pytestmark = [pytest.mark.model, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
LLAMACPP_PYTHON = Path(
    os.environ.get("CANARYD_LLAMACPP_PYTHON", REPO / ".venv-llamacpp" / "bin" / "python")
)
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
START_TIMEOUT_S = 120.0


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"llama.cpp server is required under CI=true: {reason}")
    pytest.skip(reason)


def _gguf() -> Path:
    try:
        path = require_embedded_model(models_dir()) / GGUF_NAME
    except Exception as exc:  # the provisioning error says what to run
        _unavailable(str(exc))
    if not path.is_file():
        _unavailable(f"no {GGUF_NAME} at {path.parent} (run `canaryd models pull`)")
    return path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def llamacpp_python() -> Path:
    if not LLAMACPP_PYTHON.exists():
        _unavailable(f"{LLAMACPP_PYTHON} missing: run `make llamacpp` (bash .ci/llamacpp.sh)")
    probe = subprocess.run(
        [str(LLAMACPP_PYTHON), "-c", "import llama_cpp.server"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        _unavailable(f"llama_cpp.server does not import: {probe.stderr.strip()[-300:]}")
    return LLAMACPP_PYTHON


def _start(python: Path, gguf: Path, log: Path, *extra: str) -> Iterator[str]:
    port = _free_port()
    argv = [
        str(python), "-m", "llama_cpp.server", "--model", str(gguf),
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048",
        "--n_threads", "2", "--verbose", "false", *extra,
    ]  # fmt: skip
    with log.open("w") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(
                    f"llama_cpp.server exited {process.returncode}: {log.read_text()[-2000:]}"
                )
            try:
                if httpx.get(f"{url}/v1/models", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"llama_cpp.server not ready in {START_TIMEOUT_S:g} s: "
                    f"{log.read_text()[-2000:]}"
                )
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def plain_server(llamacpp_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("llamacpp") / "plain.log"
    yield from _start(llamacpp_python, _gguf(), log)


@pytest.fixture(scope="module")
def lookup_server(llamacpp_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("llamacpp") / "lookup.log"
    yield from _start(
        llamacpp_python, _gguf(), log,
        "--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", "8",
    )  # fmt: skip


def _arm(url: str, *, speculative: bool) -> OpenAIEngine:
    return OpenAIEngine(
        OpenAIEngineConfig(
            base_url=url,
            model=GGUF_NAME,
            speculative=speculative,
            server_kind="llamacpp",
            timeouts={"connect": 5.0, "read": 60.0, "total": 180.0},
        )
    )


class TestLlamaCppPair:
    def test_pair_plain_against_prompt_lookup(self, plain_server: str, lookup_server: str) -> None:
        """Two real llama.cpp deployments, paired: both arms answer, latencies and outputs
        are recorded and scored, and acceptance is marked not reported (llama-cpp-python
        reports no draft counts)."""
        suites = {suite.name: suite for suite in load_default_suites()}
        prompt = suites["summarisation"].prompts[0]
        baseline, speculative = (
            _arm(plain_server, speculative=False),
            _arm(lookup_server, speculative=True),
        )
        try:
            for engine in (baseline, speculative):  # warm up: the first call is slow
                engine.generate(GenerationRequest(prompt.messages, SamplingParams(max_tokens=4)))
            runner = PairRunner(
                baseline, speculative, run_id="llamacpp-it", params=PairParams(max_tokens=48)
            )
            record = runner.run_pair(prompt)
        finally:
            baseline.close()
            speculative.close()
        for arm in (record.baseline, record.speculative):
            assert arm.error is ErrorKind.NONE, arm.error_detail
            assert arm.text.strip()
            # llama-cpp-python ignores stream_options: no usage chunk, so output tokens are
            # counted from content chunks and prompt_tokens stays 0 (not reported).
            assert arm.output_tokens > 0
            assert arm.ttft_s is not None and 0 < arm.ttft_s <= arm.e2e_s
        assert record.scores is not None
        assert record.speculative.acceptance_source is AcceptanceSource.NOT_REPORTED
        assert record.speculative.speculative is None
        print(  # shown with -s: what the pair measured
            f"\nbaseline {record.baseline.e2e_s:.3f} s, "
            f"speculative {record.speculative.e2e_s:.3f} s, "
            f"exact_match={record.scores.exact_match}",
            file=sys.stderr,
        )

    def test_a_healthy_lookup_arm_is_judged_by_the_baselines_top_logprobs(
        self, plain_server: str, lookup_server: str
    ) -> None:
        """Greedy pairs over a dozen prompts: the baseline streams its top log-probs, every
        divergence is judged by them (none unjudged), and quality does not FAIL the
        healthy prompt-lookup arm (its divergences are numeric ties of batched
        verification, if any)."""
        prompts = [suite.prompts[0] for suite in load_default_suites()][:12]
        baseline, speculative = (
            _arm(plain_server, speculative=False),
            _arm(lookup_server, speculative=True),
        )
        try:
            # No pair deadline but the arms' own (180 s): a loaded CI machine is slow.
            params = PairParams(max_tokens=32, timeout_s=None)
            runner = PairRunner(baseline, speculative, run_id="llamacpp-ties", params=params)
            records = [runner.run_pair(prompt) for prompt in prompts]
        finally:
            baseline.close()
            speculative.close()
        for record in records:
            assert record.baseline.ok and record.speculative.ok, record.baseline.error_detail
            logprobs = record.baseline.token_logprobs
            assert logprobs and "".join(t.token for t in logprobs) == record.baseline.text
            assert all(t.top for t in logprobs)
            assert record.speculative.token_logprobs == ()  # a speculative arm never asks
        scored = [r.scores for r in records if r.scores is not None]
        diverged = [s for s in scored if not s.exact_match]
        unjudged = [s for s in diverged if s.divergence_margin is None]
        assert not unjudged, unjudged
        assert all(s.divergence_judge in ("first", "bound") for s in diverged)
        config = QualityGateConfig(min_samples=len(records))
        decision = quality_gate(records, config, now=records[-1].started_at, arl0=DEFAULT_ARL0)
        mismatch = next(c for c in decision.components if c.name == "quality.mismatch")
        assert mismatch.state is not GateState.FAIL, mismatch.detail
        assert decision.state is not GateState.FAIL, decision.detail
        print(  # shown with -s: what the judge saw
            f"\n{len(diverged)}/{len(scored)} pairs diverged, margins "
            f"{[(round(s.divergence_margin or 0, 3), s.divergence_judge) for s in diverged]}; "
            f"{mismatch.detail}",
            file=sys.stderr,
        )

    def test_server_fault_is_a_result(self, plain_server: str) -> None:
        """A request the real server rejects (unknown route) is an `http` result."""
        engine = OpenAIEngine(
            OpenAIEngineConfig(base_url=f"{plain_server}/nope", model=GGUF_NAME, max_retries=0)
        )
        try:
            prompt = load_default_suites()[0].prompts[0]
            result = engine.generate(
                GenerationRequest(prompt.messages, SamplingParams(max_tokens=4))
            )
        finally:
            engine.close()
        assert (result.error, result.http_status) == (ErrorKind.HTTP, 404)


@pytest.fixture(scope="module")
def wrong_template_server(
    llamacpp_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The prompt-lookup deployment with the wrong chat template (alpaca instead of the
    model's own): it answers fluently, fast, and wrong for every prompt."""
    log = tmp_path_factory.mktemp("llamacpp") / "wrong.log"
    yield from _start(
        llamacpp_python, _gguf(), log, "--chat_format", "alpaca",
        "--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", "8",
    )  # fmt: skip


JUDGE_CONFIG = """
[prompts]
max_tokens = 16
[gates.latency]
mode = "warn"  # CPU timings under CI load say nothing of these arms
[gates.speedup]
mode = "warn"
"""


class TestJudgeOnTheRealPair:
    """`canaryd judge` on the real llama.cpp deployments: exit 3 while undecided, exit 1
    by a quality check on a candidate that answers wrong."""

    @staticmethod
    def judge(tmp_path: Path, baseline: str, candidate: str, pairs: int) -> tuple[int, dict]:
        config = tmp_path / "canaryd.toml"
        config.write_text(
            JUDGE_CONFIG + f'[storage]\nurl = "sqlite:///{tmp_path / "judge.db"}"\n',
            encoding="utf-8",
        )
        args = [
            "judge", "--config", str(config), "--baseline", baseline,
            "--candidate", candidate, "--model", GGUF_NAME, "--server-kind", "llamacpp",
            "--pairs", str(pairs), "--json",
        ]  # fmt: skip
        result = CliRunner().invoke(
            app, args, env={"CANARYD_CONFIG": "", "CANARYD_DATA_DIR": str(tmp_path / "data")}
        )
        return result.exit_code, json.loads(result.stdout)

    def test_a_healthy_pair_is_undecided_after_three_pairs(
        self, plain_server: str, lookup_server: str, tmp_path: Path
    ) -> None:
        """Three pairs decide nothing: exit 3 with the pairs stored."""
        code, body = self.judge(tmp_path, plain_server, lookup_server, 3)
        assert (code, body["pairs"]) == (3, 3), body["reason"]
        assert body["verdict"] in ("INCONCLUSIVE", "NODATA")

    def test_a_candidate_with_the_wrong_chat_template_fails_by_quality(
        self, plain_server: str, wrong_template_server: str, tmp_path: Path
    ) -> None:
        """Every answer differs from the baseline's: FAIL by the quality gate, early."""
        code, body = self.judge(tmp_path, plain_server, wrong_template_server, 40)
        assert (code, body["verdict"]) == (1, "FAIL"), body["reason"]
        failed = {g["name"] for g in body["gates"] if g["state"] == "FAIL"}
        assert any(name.startswith("quality") for name in failed), failed
        print(  # shown with -s: the time to a decision on the real pair
            f"\njudge: FAIL after {body['pairs']} pairs, {body['decided_after_s']} s; {failed}",
            file=sys.stderr,
        )
