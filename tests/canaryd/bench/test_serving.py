"""canaryd.bench.serving and the open-loop bench: SLO parsing, Poisson send times, the
serving figures per arm with their `vllm bench serve` keys, and `canaryd bench --rate`
through the CLI on the fake engines (with a FastChat question file as the dataset)."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd.bench.datasets import SPEC_BENCH, dataset_path, question_prompts
from canaryd.bench.serving import (
    VLLM_KEYS,
    Slo,
    parse_slo,
    poisson_arrivals,
    serving_figures,
    vllm_view,
)
from canaryd.cli.app import app
from engine.timing import inter_token_latency
from engine.types import AcceptanceSource, GenerationResult, SpeculativeStats
from tests.canaryd.bench.test_bench import env  # noqa: F401  (the fixture)


def result(ttft: float, arrivals: list[tuple[float, int]], steps: int = 0) -> GenerationResult:
    tokens = sum(n for _, n in arrivals)
    stats = None
    if steps:
        stats = SpeculativeStats(
            steps, 3 * steps, tokens - steps, (steps - 1, 0, 0), (), AcceptanceSource.DECODING_LOOP
        )
    return GenerationResult(
        text="x", token_ids=(), finish_reason="stop", prompt_tokens=3, output_tokens=tokens,
        ttft_s=ttft, tpot_s=(arrivals[-1][0] - ttft) / (tokens - 1), e2e_s=arrivals[-1][0],
        speculative=stats, itl=inter_token_latency(arrivals),
    )  # fmt: skip


class TestSlo:
    def test_parses_seconds_and_milliseconds(self) -> None:
        """`ttft=500ms,itl=0.1` is 0.5 s and 0.1 s."""
        assert parse_slo("ttft=500ms, itl=0.1").limits == (("ttft", 0.5), ("itl", 0.1))

    def test_bad_parts_are_named(self) -> None:
        """An unknown metric or a bad number names the part."""
        with pytest.raises(ValueError, match="'ttfb=1'"):
            parse_slo("ttfb=1")
        with pytest.raises(ValueError, match="'e2e=x'"):
            parse_slo("e2e=x")

    def test_a_request_meets_every_limit_or_none(self) -> None:
        """A request is good when each set limit holds (itl: its own P99 gap)."""
        request = result(0.2, [(0.2, 1), (0.3, 1), (0.9, 1)])
        assert Slo((("ttft", 0.3),)).met(request)
        assert not Slo((("ttft", 0.3), ("itl", 0.5))).met(request)


class TestPoissonArrivals:
    def test_mean_gap_is_one_over_the_rate(self) -> None:
        """2 requests per second: gaps average 0.5 s (4,000 draws, seeded), any burstiness."""
        for burstiness in (1.0, 0.5):
            times = poisson_arrivals(4000, 2.0, burstiness, seed=3)
            assert times[0] == 0.0 and times == sorted(times)
            assert times[-1] / 3999 == pytest.approx(0.5, rel=0.05)

    def test_lower_burstiness_clusters_the_sends(self) -> None:
        """A gamma shape below 1 spreads the gaps more than a Poisson process."""

        def spread(burstiness: float) -> float:
            times = poisson_arrivals(4000, 2.0, burstiness, seed=3)
            gaps = [b - a for a, b in itertools.pairwise(times)]
            mean = sum(gaps) / len(gaps)
            return sum((g - mean) ** 2 for g in gaps) / len(gaps)

        assert spread(0.25) > 2 * spread(1.0)


class TestServingFigures:
    def test_figures_by_hand(self) -> None:
        """Two requests over 2 s: ITL pooled per token (zeros in bursts) and per chunk,
        fallback steps pooled, goodput and cost per (useful) token."""
        bursty = result(0.1, [(0.1, 1), (0.3, 3), (0.4, 1)], steps=3)
        smooth = result(0.2, [(0.2, 1), (0.3, 1), (0.4, 1)], steps=3)
        figures = serving_figures(
            [bursty, smooth], 2.0, slo=Slo((("ttft", 0.15),)), resource_s=4.0,
            resource_unit="cpu_core_s", useful_tokens=4,
        )  # fmt: skip
        assert figures["completed"] == 2 and figures["output_tokens"] == 8
        # bursty gaps 0.2, 0, 0, 0.1; smooth 0.1, 0.1 → per-token median 0.1
        assert figures["itl"]["p50_ms"] == pytest.approx(100.0)
        assert figures["itl_chunk"]["mean_ms"] == pytest.approx(125.0)
        assert figures["ttft"]["p50_ms"] == pytest.approx(150.0)
        assert figures["fallback_rate"] == pytest.approx(2 / 6)
        assert figures["goodput"] == pytest.approx(0.5)
        assert figures["request_throughput"] == pytest.approx(1.0)
        assert figures["output_throughput"] == pytest.approx(4.0)
        assert figures["cost_per_token"] == pytest.approx(0.5)
        assert figures["cost_per_useful_token"] == pytest.approx(1.0)
        view = vllm_view(figures)
        assert set(view) == set(VLLM_KEYS.values())
        assert view["median_ttft_ms"] == figures["ttft"]["p50_ms"]
        assert view["median_itl_ms"] == figures["itl_chunk"]["p50_ms"]


QUESTIONS = "\n".join(
    json.dumps({"question_id": i, "category": c, "turns": [f"Question {i}: say {c}.", "More."]})
    for i, c in enumerate(["writing", "Math Reasoning", "qa", "rag"])
)


class TestQuestionFile:
    def test_first_turns_become_prompts(self, tmp_path: Path) -> None:
        """Each line's first turn is a prompt of its category (made a label)."""
        path = tmp_path / "question.jsonl"
        path.write_text(QUESTIONS + "\n")
        prompts = question_prompts(path, 32)
        assert [p.category for p in prompts] == ["writing", "math_reasoning", "qa", "rag"]
        assert prompts[1].messages[0].content == "Question 1: say Math Reasoning."

    def test_spec_bench_is_bundled(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """`spec_bench` names Spec-Bench's 480 questions, bundled compressed: 80 each of its
        five tasks and MT-Bench's eight categories of 10; a file of that name wins."""
        monkeypatch.chdir(tmp_path)
        prompts = question_prompts(dataset_path(SPEC_BENCH), 32)
        assert len(prompts) == 480 and len({p.id for p in prompts}) == 480
        counts = Counter(p.category for p in prompts)
        assert {counts[c] for c in ("translation", "summarization", "qa", "rag")} == {80}
        assert counts["math_reasoning"] == 80 and counts["writing"] == 10
        assert prompts[0].suite == "spec_bench_question"
        (tmp_path / SPEC_BENCH).write_text(QUESTIONS + "\n")
        assert len(question_prompts(dataset_path(SPEC_BENCH), 32)) == 4

    def test_a_bad_line_is_named(self, tmp_path: Path) -> None:
        """A line without turns names the file and line."""
        path = tmp_path / "question.jsonl"
        path.write_text('{"question_id": 1}\n')
        with pytest.raises(ValueError, match=r"question\.jsonl:1"):
            question_prompts(path, 32)


class TestOpenLoopBench:
    def test_rate_levels_report_serving_figures_per_arm(self, env: Path) -> None:  # noqa: F811
        """`--rate 40,80 --requests 6 --json --out F.json` on a question file: one level
        per rate, each arm with ttft/itl/tpot/e2e percentiles, fallback rate, goodput,
        throughput and cost per useful token under canaryd's and vLLM's keys; the warm-up
        requests reported apart as cold."""
        questions = env / "question.jsonl"
        questions.write_text(QUESTIONS + "\n")
        out = env / "serve.json"
        result = CliRunner().invoke(
            app,
            ["bench", "-c", str(env / "canaryd.toml"), "--rate", "40,80", "--requests", "6",
             "--warmup", "1", "--slo", "ttft=10,itl=5", "--dataset", str(questions),
             "--json", "--out", str(out)],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        results = json.loads(result.stdout)
        assert json.loads(out.read_text()) == results
        assert [level["rate"] for level in results["serving"]] == [40.0, 80.0]
        for level in results["serving"]:
            assert set(level["arms"]) == {"baseline", "speculative"}
            for figures in level["arms"].values():
                for metric in ("ttft", "itl", "tpot", "e2e"):
                    assert {"p50_ms", "p95_ms", "p99_ms"} <= set(figures[metric])
                assert figures["completed"] == 6
                assert figures["goodput"] == pytest.approx(figures["request_throughput"])
                assert figures["output_throughput"] > 0
                assert figures["vllm"]["completed"] == 6
            assert level["arms"]["speculative"]["fallback_rate"] is not None
            assert level["arms"]["baseline"]["fallback_rate"] is None
            assert "speculative" in level["cost_ratio"]
        assert set(results["cold"]) == {"baseline", "speculative"}
        assert results["cold"]["baseline"]["requests"] == 1
        assert results["plan"]["rates"] == [40.0, 80.0]
        assert results["plan"]["slo"] == {"ttft": 10.0, "itl": 5.0}

    def test_the_markdown_shows_the_serving_table(self, env: Path) -> None:  # noqa: F811
        """Without --json the bench prints the serving table: a cold row per arm and a
        row per arm at the rate level, with the cost ratio on the speculative row."""
        result = CliRunner().invoke(
            app,
            ["bench", "-c", str(env / "canaryd.toml"), "--rate", "40", "--requests", "4",
             "--warmup", "1", "--out", str(env / "out")],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert "Serving figures per level and arm" in result.stdout
        rows = [line for line in result.stdout.splitlines() if line.startswith("| r=40/s")]
        assert len(rows) == 2
        assert sum(line.startswith("| cold") for line in result.stdout.splitlines()) == 2


class TestReportLatency:
    def test_the_report_gives_each_arm_its_requests_itl_p99(self) -> None:
        """`canaryd report`'s latency table has an ITL row: percentiles over requests of
        each one's own P99 gap; requests without one are left out."""
        from canaryd.report.figures import arm_latency
        from canaryd.report.tables import latency_table
        from gates.pairs.testing import record
        from gates.pairs.testing import result as gate_result

        records = [
            record(i, baseline=gate_result(itl_p99=0.01 * (i + 1)), speculative=gate_result())
            for i in range(5)
        ]
        latency = arm_latency(records)
        assert latency["baseline"]["itl_p99_s"].p50 == pytest.approx(0.03)
        assert latency["speculative"]["itl_p99_s"].p50 is None
        assert "ITL P99 per request" in latency_table(latency).markdown()

    def test_a_bad_slo_is_one_clear_line(self, env: Path) -> None:  # noqa: F811
        """An unknown SLO metric fails before anything runs, naming it."""
        result = CliRunner().invoke(
            app, ["bench", "-c", str(env / "canaryd.toml"), "--rate", "2", "--slo", "ttfb=1"]
        )
        assert result.exit_code != 0
        assert "ttfb=1" in result.output
