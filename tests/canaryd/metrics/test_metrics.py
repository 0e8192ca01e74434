"""canaryd.metrics: pair records from real fake-engine runs become exact counter and
histogram values, in a registry of their own, with bounded labels and documented names."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from canaryd.metrics import (
    ACCEPTANCE_LENGTH_BUCKETS,
    LATENCY_BUCKETS,
    CanarydMetrics,
    metrics_reference,
    pair_outcome,
    position_label,
)
from canaryd.pairs.runner import PairRunner
from engine.config import FakeEngineConfig
from engine.fake import FakeEngine
from engine.types import Message, SpeculativeStats
from gates.records import ARMS, PairRecord, Prompt

DOCS = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"


def prompt(category: str, n: int = 0) -> Prompt:
    text = f"summarise the canary report number {n} for {category} in a few words please"
    return Prompt(
        id=f"{category}-{n}",
        category=category,
        messages=(Message("user", text),),
        max_tokens=48,
    )


def run_pairs(
    prompts: list[Prompt],
    baseline: FakeEngineConfig | None = None,
    speculative: FakeEngineConfig | None = None,
) -> list[PairRecord]:
    runner = PairRunner(
        FakeEngine(baseline or FakeEngineConfig()),
        FakeEngine(speculative or FakeEngineConfig(speculative=True, num_draft_tokens=4)),
        run_id="test",
        seed=7,
    )
    return [runner.run_pair(p) for p in prompts]


def value(metrics: CanarydMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def series(metrics: CanarydMetrics, family: str) -> set[tuple[tuple[str, str], ...]]:
    """The label sets of every sample of `family`, without `le`."""
    return {
        tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
        for metric in metrics.registry.collect()
        if metric.name == family
        for sample in metric.samples
    }


@pytest.fixture
def metrics() -> CanarydMetrics:
    return CanarydMetrics()


class TestRegistry:
    def test_each_instance_has_its_own_registry(self) -> None:
        """Two instances never share series, and neither touches the global registry."""
        from prometheus_client import REGISTRY

        first, second = CanarydMetrics(), CanarydMetrics()
        first.pairs.observe_group(run_pairs([prompt("qa")])[:1])
        assert value(first, "canaryd_pairs_total", category="qa", outcome="complete") == 1
        assert value(second, "canaryd_pairs_total", category="qa", outcome="complete") is None
        assert REGISTRY.get_sample_value("canaryd_pairs_total", {}) is None

    def test_uses_a_registry_it_is_given(self) -> None:
        """A registry passed in is the one the metrics are registered in."""
        registry = CollectorRegistry()
        metrics = CanarydMetrics(registry)
        assert metrics.registry is registry
        metrics.liveness.heartbeat(123.0)
        assert registry.get_sample_value("canaryd_heartbeat_timestamp_seconds") == 123.0

    def test_render_is_valid_text_exposition(self, metrics: CanarydMetrics) -> None:
        """render() parses as Prometheus text and carries every documented family."""
        for record in run_pairs([prompt("qa", i) for i in range(5)]):
            metrics.pairs.observe_group((record,))
        metrics.build.set("0.1.0", "3.11.9", "2.13.0", "4.50.0", {"kind": "fake"}, {})
        families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
        for doc in metrics.reference:
            # Text exposition names counter families without `_total`, info with `_info`.
            assert doc.name.removesuffix("_total") in families, doc.name
        assert families["canaryd_e2e_seconds"].type == "histogram"
        assert families["canaryd_pairs"].type == "counter"


class TestObservePair:
    def test_counts_pairs_latencies_and_tokens_exactly(self, metrics: CanarydMetrics) -> None:
        """Every complete pair adds one pair, one latency per arm and its output tokens."""
        records = run_pairs([prompt("qa", i) for i in range(6)])
        for record in records:
            metrics.pairs.observe_group((record,))
        assert value(metrics, "canaryd_pairs_total", category="qa", outcome="complete") == 6
        for arm in ARMS:
            results = [getattr(r, arm) for r in records]
            labels = {"arm": arm, "category": "qa"}
            assert value(metrics, "canaryd_e2e_seconds_count", **labels) == 6
            assert value(metrics, "canaryd_e2e_seconds_sum", **labels) == pytest.approx(
                sum(g.e2e_s for g in results)
            )
            assert value(metrics, "canaryd_ttft_seconds_count", **labels) == 6
            assert value(metrics, "canaryd_output_tokens_total", **labels) == sum(
                g.output_tokens for g in results
            )
            for bound in LATENCY_BUCKETS:
                expected = sum(g.e2e_s <= bound for g in results)
                assert value(metrics, "canaryd_e2e_seconds_bucket", le=str(bound), **labels) == (
                    expected
                )

    def test_counts_acceptance_from_the_decoding_loop(self, metrics: CanarydMetrics) -> None:
        """Accepted, drafted and verify counters equal the sums of the pairs' figures."""
        records = run_pairs([prompt("code", i) for i in range(8)])
        for record in records:
            metrics.pairs.observe_group((record,))
        stats = [r.speculative.speculative for r in records]
        assert all(s is not None for s in stats)
        accepted = sum(s.accepted_tokens for s in stats if s)
        drafted = sum(s.draft_tokens or 0 for s in stats if s)
        steps = sum(s.verify_steps for s in stats if s)
        c = {"arm": "speculative", "category": "code"}
        assert value(metrics, "canaryd_speculative_accepted_tokens_total", **c) == accepted
        assert value(metrics, "canaryd_speculative_draft_tokens_total", **c) == drafted
        assert value(metrics, "canaryd_speculative_accepted_of_drafted_tokens_total", **c) == (
            accepted
        )
        assert value(metrics, "canaryd_speculative_verify_steps_total", **c) == steps
        lengths = [r.speculative.acceptance_length for r in records]
        assert value(metrics, "canaryd_speculative_acceptance_length_count", **c) == 8
        assert value(metrics, "canaryd_speculative_acceptance_length_sum", **c) == pytest.approx(
            sum(x for x in lengths if x is not None)
        )
        for bound in ACCEPTANCE_LENGTH_BUCKETS:
            expected = sum(x is not None and x <= bound for x in lengths)
            assert (
                value(metrics, "canaryd_speculative_acceptance_length_bucket", le=str(bound), **c)
                == expected
            )
        assert value(metrics, "canaryd_speculative_acceptance_not_reported_total", **c) is None

    def test_itl_observes_every_token_gap(self, metrics: CanarydMetrics) -> None:
        """`canaryd_itl_seconds` gets one observation per output token after the first on
        each arm, zeros inside a verify step's burst, summing to the arm's gaps."""
        records = run_pairs([prompt("code", i) for i in range(4)])
        for record in records:
            metrics.pairs.observe_group((record,))
        for arm in ("baseline", "speculative"):
            results = [getattr(r, arm) for r in records]
            gaps = [g for r in results if r.itl is not None for g in r.itl.token_gaps()]
            c = {"arm": arm, "category": "code"}
            assert value(metrics, "canaryd_itl_seconds_count", **c) == sum(
                r.output_tokens - 1 for r in results
            )
            assert value(metrics, "canaryd_itl_seconds_sum", **c) == pytest.approx(sum(gaps))
        bursts = sum(
            g == 0.0 for r in records if r.speculative.itl for g in r.speculative.itl.token_gaps()
        )
        assert bursts > 0
        zeros = value(
            metrics, "canaryd_itl_seconds_bucket", le="0.001", arm="speculative", category="code"
        )
        assert zeros is not None and zeros >= bursts

    def test_fallback_steps_split_the_verify_steps(self, metrics: CanarydMetrics) -> None:
        """Fallback and accepted steps add up to the verify steps, the fallback ones being
        the steps whose first draft position was not kept."""
        records = run_pairs([prompt("code", i) for i in range(8)])
        for record in records:
            metrics.pairs.observe_group((record,))
        stats = [s for r in records if (s := r.speculative.speculative) is not None]
        c = {"arm": "speculative", "category": "code"}
        fallback = value(
            metrics, "canaryd_speculative_fallback_steps_total", outcome="fallback", **c
        )
        kept = value(metrics, "canaryd_speculative_fallback_steps_total", outcome="accepted", **c)
        assert kept == sum(s.accepted_per_position[0] for s in stats)
        assert fallback == sum(s.verify_steps for s in stats) - kept
        assert fallback is not None and fallback > 0

    def test_counts_acceptance_per_draft_position(self, metrics: CanarydMetrics) -> None:
        """Per-position counters equal the sums of accepted and drafted per position."""
        records = run_pairs([prompt("rag", i) for i in range(5)])
        for record in records:
            metrics.pairs.observe_group((record,))
        for index in range(4):
            accepted = drafted = 0
            for r in records:
                assert r.speculative.speculative is not None
                accepted += r.speculative.speculative.accepted_per_position[index]
                drafted += r.speculative.speculative.drafted_per_position[index]
            position = str(index + 1)
            assert (
                value(
                    metrics,
                    "canaryd_speculative_position_accepted_total",
                    arm="speculative",
                    position=position,
                )
                == accepted
            )
            assert (
                value(
                    metrics,
                    "canaryd_speculative_position_drafted_total",
                    arm="speculative",
                    position=position,
                )
                == drafted
            )
        fifth = {"arm": "speculative", "position": "5"}
        assert value(metrics, "canaryd_speculative_position_drafted_total", **fifth) is None

    def test_positions_past_fifteen_share_one_label(self, metrics: CanarydMetrics) -> None:
        """A draft of 20 tokens yields positions 1..15 and "16+", which sums the rest."""
        speculative = FakeEngineConfig(speculative=True, num_draft_tokens=20, acceptance_rate=1.0)
        records = run_pairs([prompt("math", i) for i in range(3)], speculative=speculative)
        for record in records:
            metrics.pairs.observe_group((record,))
        positions = {
            dict(s)["position"] for s in series(metrics, "canaryd_speculative_position_drafted")
        }
        assert positions <= {str(i) for i in range(1, 16)} | {"16+"}
        assert "16+" in positions
        drafted_tail = sum(
            sum(r.speculative.speculative.drafted_per_position[15:])
            for r in records
            if r.speculative.speculative
        )
        assert (
            value(
                metrics,
                "canaryd_speculative_position_drafted_total",
                arm="speculative",
                position="16+",
            )
            == drafted_tail
        )
        assert [position_label(p) for p in (1, 15, 16, 17, 40)] == ["1", "15", "16+", "16+", "16+"]

    def test_speedup_and_exact_match(self, metrics: CanarydMetrics) -> None:
        """Complete pairs add their speedup and count as compared and (fake: identical) matching."""
        records = run_pairs([prompt("translation", i) for i in range(4)])
        for record in records:
            metrics.pairs.observe_group((record,))
        c = {"arm": "speculative", "category": "translation"}
        assert value(metrics, "canaryd_speedup_ratio_count", **c) == 4
        assert value(metrics, "canaryd_speedup_ratio_sum", **c) == pytest.approx(
            sum(r.speedup for r in records if r.speedup is not None)
        )
        assert value(metrics, "canaryd_pairs_compared_total", **c) == 4
        assert value(metrics, "canaryd_pairs_exact_match_total", **c) == sum(
            bool(r.scores and r.scores.exact_match) for r in records
        )

    def test_corrupted_outputs_are_compared_but_not_matching(self, metrics: CanarydMetrics) -> None:
        """A speculative arm that corrupts every output is compared and never matches."""
        speculative = FakeEngineConfig(speculative=True, corrupt_rate=1.0)
        for record in run_pairs([prompt("qa", i) for i in range(3)], speculative=speculative):
            metrics.pairs.observe_group((record,))
        c = {"arm": "speculative", "category": "qa"}
        assert value(metrics, "canaryd_pairs_compared_total", **c) == 3
        assert value(metrics, "canaryd_pairs_exact_match_total", **c) is None

    def test_task_score_delta_only_when_scored(self, metrics: CanarydMetrics) -> None:
        """Prompts without a check or reference observe no quality delta at all."""
        for record in run_pairs([prompt("qa", i) for i in range(3)]):
            assert record.scores is not None and record.scores.task_score_delta is None
            metrics.pairs.observe_group((record,))
        assert not series(metrics, "canaryd_task_score_delta")


class TestAcceptanceNotReported:
    def test_counts_the_pair_instead_of_observing_zeros(self, metrics: CanarydMetrics) -> None:
        """A speculative engine without acceptance figures adds to not_reported and nothing
        to the acceptance histogram, counters or positions."""
        not_reporting = FakeEngineConfig(seed=3)  # answers, but reports no SpeculativeStats
        records = run_pairs([prompt("qa", i) for i in range(4)], speculative=not_reporting)
        assert all(r.speculative.ok and r.speculative.speculative is None for r in records)
        for record in records:
            metrics.pairs.observe_group((record,))
        c = {"arm": "speculative", "category": "qa"}
        assert value(metrics, "canaryd_speculative_acceptance_not_reported_total", **c) == 4
        assert value(metrics, "canaryd_speculative_acceptance_length_count", **c) is None
        for name in (
            "accepted_tokens",
            "accepted_of_drafted_tokens",
            "draft_tokens",
            "verify_steps",
        ):
            assert value(metrics, f"canaryd_speculative_{name}_total", **c) is None
        assert not series(metrics, "canaryd_speculative_position_accepted")
        assert not series(metrics, "canaryd_speculative_acceptance_length")
        # The pair itself still counts, with its timings.
        assert value(metrics, "canaryd_pairs_total", outcome="complete", category="qa") == 4
        assert value(metrics, "canaryd_e2e_seconds_count", **c) == 4


class TestErrors:
    def test_failed_arms_count_errors_not_latencies(self, metrics: CanarydMetrics) -> None:
        """An arm that fails adds to errors_total by kind and to no latency histogram."""
        failing = FakeEngineConfig(speculative=True, error_rate=1.0)
        records = run_pairs([prompt("qa", i) for i in range(3)], speculative=failing)
        for record in records:
            assert pair_outcome(record) == "speculative_error"
            metrics.pairs.observe_group((record,))
        assert (
            value(metrics, "canaryd_pairs_total", category="qa", outcome="speculative_error") == 3
        )
        assert value(metrics, "canaryd_pairs_total", category="qa", outcome="complete") is None
        assert value(metrics, "canaryd_errors_total", arm="speculative", kind="http") == 3
        assert value(metrics, "canaryd_errors_total", arm="baseline", kind="http") == 0
        assert value(metrics, "canaryd_e2e_seconds_count", arm="speculative", category="qa") is None
        assert value(metrics, "canaryd_e2e_seconds_count", arm="baseline", category="qa") == 3
        assert not series(metrics, "canaryd_speedup_ratio")
        assert not series(metrics, "canaryd_pairs_compared")

    def test_both_arms_timing_out(self, metrics: CanarydMetrics) -> None:
        """Both arms failing is a both_error pair with one timeout per arm."""
        baseline = FakeEngineConfig(timeout_rate=1.0)
        speculative = FakeEngineConfig(speculative=True, timeout_rate=1.0)
        for record in run_pairs([prompt("qa")], baseline=baseline, speculative=speculative):
            metrics.pairs.observe_group((record,))
        assert value(metrics, "canaryd_pairs_total", category="qa", outcome="both_error") == 1
        for arm in ARMS:
            assert value(metrics, "canaryd_errors_total", arm=arm, kind="timeout") == 1

    def test_store_errors_by_bounded_kind(self, metrics: CanarydMetrics) -> None:
        """Store errors count by kind; free-form or excess kinds fold into `other`."""
        metrics.store.error("connection")
        metrics.store.error("connection")
        metrics.store.error("Not A Label!")
        for i in range(40):
            metrics.store.error(f"kind_{i}")
        assert value(metrics, "canaryd_store_errors_total", kind="connection") == 2
        kinds = {dict(s)["kind"] for s in series(metrics, "canaryd_store_errors")}
        assert len(kinds) <= 17
        assert value(metrics, "canaryd_store_errors_total", kind="other") == 1 + (40 - 15)


class TestCardinality:
    def test_many_prompts_stay_within_categories_and_arms(self, metrics: CanarydMetrics) -> None:
        """200 distinct prompts in 4 categories make at most 4 x 2 latency label sets."""
        categories = ["qa", "code", "math", "rag"]
        prompts = [prompt(categories[i % 4], i) for i in range(200)]
        for record in run_pairs(prompts):
            metrics.pairs.observe_group((record,))
        expected = {
            (("arm", arm), ("category", category)) for arm in ARMS for category in categories
        }
        for family in ("canaryd_e2e_seconds", "canaryd_ttft_seconds", "canaryd_tpot_seconds"):
            assert series(metrics, family) == expected
        text = metrics.render().decode()
        assert "qa-1" not in text and "pair_id" not in text

    def test_categories_beyond_the_cap_fold_into_other(self) -> None:
        """Past `max_categories` distinct categories, new ones are counted as `other`."""
        metrics = CanarydMetrics(categories=["qa"], max_categories=3)
        for record in run_pairs([prompt(f"cat{i}") for i in range(6)] + [prompt("qa")]):
            metrics.pairs.observe_group((record,))
        seen = {dict(s)["category"] for s in series(metrics, "canaryd_pairs")}
        assert seen == {"qa", "cat0", "cat1", "other"}
        assert value(metrics, "canaryd_pairs_total", category="other", outcome="complete") == 4

    def test_known_categories_start_at_zero(self) -> None:
        """Configured categories have pair counters at 0 before any pair, not absent."""
        metrics = CanarydMetrics(categories=["qa", "code"])
        assert value(metrics, "canaryd_pairs_total", category="code", outcome="complete") == 0
        assert value(metrics, "canaryd_errors_total", arm="baseline", kind="oom") == 0


class TestDaemonState:
    def test_cycles_and_timestamps(self, metrics: CanarydMetrics) -> None:
        """A failed cycle moves the last-cycle time but not the last-success time."""
        metrics.liveness.cycle_finished(1000.0, ok=True)
        metrics.liveness.cycle_finished(1030.0, ok=False)
        assert value(metrics, "canaryd_last_cycle_success_timestamp_seconds") == 1000.0
        assert value(metrics, "canaryd_last_cycle_timestamp_seconds") == 1030.0
        assert value(metrics, "canaryd_cycles_total", outcome="ok") == 1
        assert value(metrics, "canaryd_cycles_total", outcome="failed") == 1

    def test_heartbeat_readiness_and_pending(self, metrics: CanarydMetrics) -> None:
        """Heartbeat, engine readiness and buffered pairs are plain gauges."""
        metrics.liveness.heartbeat(42.5)
        metrics.liveness.set_engine_ready("baseline", True)
        metrics.store.pending_pairs(7)
        assert value(metrics, "canaryd_heartbeat_timestamp_seconds") == 42.5
        assert value(metrics, "canaryd_engine_ready", arm="baseline") == 1
        assert value(metrics, "canaryd_engine_ready", arm="speculative") == 0
        assert value(metrics, "canaryd_store_pending_pairs") == 7

    def test_build_info_is_one_series_replaced_on_reload(self, metrics: CanarydMetrics) -> None:
        """Build info keeps a single series whose labels carry versions and arm identities."""
        metrics.build.set(
            "0.1.0", "3.11.9", "2.13.0", "4.50.0", {"kind": "fake", "mode": "baseline"}, {}
        )
        metrics.build.set(
            "0.1.1", "3.11.9", "2.13.0", "4.50.0", {"kind": "fake"}, {"model": "x" * 300}
        )
        samples = [s for f in metrics.registry.collect() if f.name == "canaryd_build"
                   for s in f.samples]  # fmt: skip
        assert len(samples) == 1
        labels = samples[0].labels
        assert labels["version"] == "0.1.1"
        assert labels["baseline_kind"] == "fake"
        assert "baseline_mode" not in labels
        assert labels["speculative_model"] == "x" * 128

    def test_build_info_exports_no_credentials(self, metrics: CanarydMetrics) -> None:
        """An engine's base_url is exported as scheme, host, port and path only; identity
        fields outside the allowlist (an API key an engine might report) are not exported
        at all, and a credential inside an allowed value is masked."""
        metrics.build.set(
            "0.1.0",
            "3.11.9",
            "2.13.0",
            "4.50.0",
            {
                "kind": "openai",
                "base_url": "https://canary:hunter2@llm.internal:8443/v1?api_key=sk-hunter2#x",
                "api_key": "sk-hunter2",
                "model": "https://user:hunter2@hub.example/m",
            },
            {"kind": "openai", "base_url": "http://[::1]:8000/v1"},
        )
        body = metrics.render().decode()
        assert "hunter2" not in body
        (sample,) = [s for f in metrics.registry.collect() if f.name == "canaryd_build"
                     for s in f.samples]  # fmt: skip
        assert sample.labels["baseline_base_url"] == "https://llm.internal:8443/v1"
        assert sample.labels["speculative_base_url"] == "http://[::1]:8000/v1"
        assert sample.labels["baseline_model"] == "https://user:***@hub.example/m"
        assert "baseline_api_key" not in sample.labels


class TestReference:
    def test_documents_every_registered_family(self) -> None:
        """The reference lists exactly the families the registry exposes."""
        metrics = CanarydMetrics()
        registered = {f.name for f in metrics.registry.collect()}
        documented = {
            d.name.removesuffix("_total").removesuffix("_info") for d in metrics.reference
        }
        assert registered == documented
        assert all(d.name.startswith("canaryd_") and d.meaning and d.example
                   for d in metrics.reference)  # fmt: skip

    def test_docs_carry_the_generated_table_verbatim(self) -> None:
        """docs/metrics.md contains metrics_reference() unchanged, so docs never drift."""
        assert metrics_reference() in DOCS.read_text(encoding="utf-8"), (
            "docs/metrics.md is stale: paste the output of "
            "`python -c 'from canaryd.metrics import metrics_reference as m; print(m())'`"
        )


def with_stats(record: PairRecord, stats: SpeculativeStats) -> PairRecord:
    return replace(record, speculative=replace(record.speculative, speculative=stats))


class TestDraftedNotReported:
    def test_unreported_drafted_count_does_not_move_the_drafted_counter(
        self, metrics: CanarydMetrics
    ) -> None:
        """Stats with draft_tokens None count steps and accepted tokens, but neither the
        drafted counter nor the acceptance rate's numerator moves, and no position is
        counted from empty per-position tuples."""
        [reported, unreported] = run_pairs([prompt("qa", 0), prompt("qa", 1)])
        reported = with_stats(
            reported, SpeculativeStats(verify_steps=4, draft_tokens=12, accepted_tokens=6,
                                       accepted_per_position=(3, 2, 1),
                                       drafted_per_position=(4, 4, 4))
        )  # fmt: skip
        unreported = with_stats(
            unreported, SpeculativeStats(verify_steps=5, draft_tokens=None, accepted_tokens=7,
                                         accepted_per_position=())
        )  # fmt: skip
        c = {"arm": "speculative", "category": "qa"}
        metrics.pairs.observe_group((reported,))
        before = value(metrics, "canaryd_speculative_draft_tokens_total", **c)
        metrics.pairs.observe_group((unreported,))
        assert before == 12
        assert value(metrics, "canaryd_speculative_draft_tokens_total", **c) == 12
        assert value(metrics, "canaryd_speculative_accepted_of_drafted_tokens_total", **c) == 6
        assert value(metrics, "canaryd_speculative_accepted_tokens_total", **c) == 13
        assert value(metrics, "canaryd_speculative_verify_steps_total", **c) == 9
        assert value(metrics, "canaryd_speculative_acceptance_not_reported_total", **c) is None
        first = {"arm": "speculative", "position": "1"}
        assert value(metrics, "canaryd_speculative_position_drafted_total", **first) == 4
        assert value(metrics, "canaryd_speculative_position_accepted_total", **first) == 3

    def test_drafted_positions_without_accepted_positions_are_not_counted(
        self, metrics: CanarydMetrics
    ) -> None:
        """Drafted per position without accepted per position is not a run of zero
        acceptances: neither per-position counter moves."""
        [record] = run_pairs([prompt("qa", 0)])
        record = with_stats(
            record, SpeculativeStats(verify_steps=4, draft_tokens=12, accepted_tokens=6,
                                     accepted_per_position=(), drafted_per_position=(4, 4, 4))
        )  # fmt: skip
        metrics.pairs.observe_group((record,))
        assert not series(metrics, "canaryd_speculative_position_drafted")
        assert not series(metrics, "canaryd_speculative_position_accepted")


class TestGateStates:
    def test_a_telemetry_gate_keeps_its_dotted_name(self, metrics: CanarydMetrics) -> None:
        """`telemetry.errors` is exported under its own name, not folded into `other`, so a
        dashboard and an alert can tell which telemetry gate failed."""
        metrics.switch.observe_gates([("telemetry.errors", "FAIL"), ("latency", "PASS")])
        assert value(metrics, "canaryd_gate_state", gate="telemetry.errors", state="FAIL") == 1
        assert value(metrics, "canaryd_gate_state", gate="latency", state="PASS") == 1
        assert value(metrics, "canaryd_gate_state", gate="other", state="FAIL") is None
