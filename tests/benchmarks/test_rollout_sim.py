"""The rollout benchmark's emulation of Argo Rollouts and Flagger, and its arms' draws,
without a clock: each tool's counting is checked against the rules read in its source,
on the shipped examples."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.rollout_sim import argo, flagger, play
from benchmarks.rollout_sim.arms import (
    OTHER_WORD,
    ArmBehaviour,
    ArmModel,
    StallSchedule,
    answer_words,
    spec_decode_metrics,
)
from benchmarks.rollout_sim.config import run_config, shipped, toml_text
from benchmarks.rollout_sim.durations import seconds
from benchmarks.rollout_sim.scenarios import SCENARIOS
from engine import acceptance

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
ARGS = {"revision": "6b5b9c8d7f", "canaryd-token": "secret"}


def _metric() -> argo.WebMetric:
    return argo.load_template(EXAMPLES / "argo" / "analysis-template.yaml", ARGS)


def _answer(verdict: str, fresh: bool = True) -> tuple[int, bytes]:
    return 200, json.dumps({"verdict": verdict, "fresh": fresh, "pairs": 40}).encode()


class TestCondition:
    def test_shipped_conditions(self) -> None:
        """The template's success condition needs a fresh PASS; its failure condition a FAIL."""
        metric = _metric()
        assert argo.evaluate(metric.success_condition, {"verdict": "PASS", "fresh": True})
        assert not argo.evaluate(metric.success_condition, {"verdict": "PASS", "fresh": False})
        assert not argo.evaluate(metric.success_condition, {"verdict": "NODATA", "fresh": True})
        assert argo.evaluate(metric.failure_condition, {"verdict": "FAIL"})

    def test_missing_key_in_a_logical_operator_is_an_error(self) -> None:
        """`result.fresh` missing reads nil, and `&&` on nil is an error, as in expr; the
        left side short-circuits first."""
        with pytest.raises(argo.ConditionError, match="expected bool"):
            argo.evaluate('result.verdict == "PASS" && result.fresh', {"verdict": "PASS"})
        assert not argo.evaluate('result.verdict == "PASS" && result.fresh', {"verdict": "FAIL"})

    def test_operators(self) -> None:
        """Comparisons, not/!, or/||, parentheses, single-quoted strings and nested keys."""
        result = {"a": {"b": 3}, "s": "x"}
        assert argo.evaluate("result.a.b >= 3 and !(result.s == 'y')", result)
        assert argo.evaluate("result.a.b < 2 || not false", result)
        assert argo.evaluate("result.missing == nil", result)
        with pytest.raises(argo.ConditionError):
            argo.evaluate("result.s < 3", result)


class TestArgoCounting:
    def test_template_is_read_with_its_arguments(self) -> None:
        """Interval, count and limits come from the shipped template; args are substituted
        into the URL and the bearer header."""
        metric = _metric()
        assert (metric.interval_s, metric.count, metric.consecutive_success_limit) == (60.0, 45, 3)
        assert (metric.failure_limit, metric.inconclusive_limit) == (0, 45)
        assert metric.consecutive_error_limit == 5
        assert "revision=6b5b9c8d7f" in metric.url and metric.method == "POST"
        assert ("Authorization", "Bearer secret") in metric.headers

    def test_analysis_runs_at_the_rollouts_first_weight(self) -> None:
        """The shipped Rollout sets 10 % before its analysis step."""
        assert argo.analysis_weight(EXAMPLES / "argo" / "rollout.yaml") == 10

    def test_three_fresh_passes_in_a_row_succeed(self) -> None:
        """Undecided measurements are Inconclusive and reset the run of successes; three
        Successful in a row end the metric Successful."""
        metric, result = _metric(), argo.MetricResult()
        for verdict in ("NODATA", "PASS", "INCONCLUSIVE", "PASS", "PASS"):
            result.record(metric, argo.measurement_phase(metric, *_answer(verdict))[0])
            assert result.phase is None
        result.record(metric, argo.measurement_phase(metric, *_answer("PASS"))[0])
        assert result.phase == "Successful" and result.count == 6
        assert "".join(p[0] for p in result.phases) == "ISISSS"

    def test_one_fail_fails_the_analysis(self) -> None:
        """failureLimit 0: the first Failed measurement fails the metric."""
        metric, result = _metric(), argo.MetricResult()
        result.record(metric, argo.measurement_phase(metric, *_answer("FAIL"))[0])
        assert result.phase == "Failed"
        assert result.message == "failed (1) > failureLimit (0)"

    def test_count_without_three_successes_is_inconclusive(self) -> None:
        """Reaching count with the success limit unmet and no failure: Inconclusive."""
        metric, result = _metric(), argo.MetricResult()
        for _ in range(metric.count):
            result.record(metric, "Inconclusive")
        assert result.phase == "Inconclusive" and "Not Reached" in result.message

    def test_errors_do_not_count_and_six_in_a_row_error(self) -> None:
        """A non-2xx answer is an Error: not counted toward count, retried after 10 s;
        more than consecutiveErrorLimit in a row error the metric."""
        metric, result = _metric(), argo.MetricResult()
        phase, message = argo.measurement_phase(metric, 503, b"{}")
        assert phase == "Error" and "503" in message
        assert argo.next_measurement_after(metric, phase) == 10.0
        for _ in range(metric.consecutive_error_limit):
            result.record(metric, "Error")
        assert result.phase is None and result.count == 0
        result.record(metric, "Error")
        assert result.phase == "Error"

    def test_unparsable_condition_input_is_an_error(self) -> None:
        """A PASS without `fresh` cannot be evaluated: an Error, not a success."""
        metric = _metric()
        phase, _ = argo.measurement_phase(metric, 200, b'{"verdict": "PASS"}')
        assert phase == "Error"


def _caller(answers: dict[str, Iterator[int]]) -> tuple[flagger.CallHook, list[str]]:
    calls: list[str] = []

    def call(hook: flagger.Webhook, phase: flagger.CanaryPhase) -> flagger.HookAnswer:
        calls.append(hook.type)
        return flagger.HookAnswer(next(answers[hook.type]))

    return call, calls


def _always(status: int) -> Iterator[int]:
    while True:
        yield status


def _phase(run: flagger.CanaryRun) -> str:
    """The run's phase, read afresh (mypy would keep an earlier assert's narrowing)."""
    return run.phase


def _canary() -> flagger.CanaryRun:
    return flagger.CanaryRun(flagger.load_canary(EXAMPLES / "flagger" / "canary.yaml"))


class TestFlaggerCanary:
    def test_canary_is_read(self) -> None:
        """Interval, threshold, weights and the five webhooks of the shipped Canary, each
        retried twice and carrying the token's placeholder."""
        analysis = _canary().analysis
        assert (analysis.interval_s, analysis.threshold) == (60.0, 5)
        assert (analysis.step_weight, analysis.max_weight) == (10, 50)
        assert {w.type for w in analysis.webhooks} == {
            "pre-rollout",
            "rollout",
            "confirm-traffic-increase",
            "confirm-promotion",
            "rollback",
        }
        [promotion] = analysis.hooks("confirm-promotion")
        assert promotion.metadata == {"token": flagger.TOKEN_PLACEHOLDER, "min_pairs": "30"}
        assert promotion.timeout_s == 10.0
        assert {w.retries for w in analysis.webhooks} == {2}

    def test_each_webhook_posts_the_token_in_its_metadata(self) -> None:
        """The run posts every hook's metadata with the daemon's token in place of the
        placeholder, as the guide's `sed` puts it in; the rest of it unchanged."""
        for hook in _canary().analysis.webhooks:
            metadata = play.hook_metadata(hook, "s3cret")
            assert metadata == {**hook.metadata, "token": "s3cret"}

    def test_healthy_canary_steps_to_max_weight_then_promotes(self) -> None:
        """pre-rollout while the weight is 0, rollout after; a step each iteration the
        traffic increase is confirmed; at maxWeight, confirm-promotion decides."""
        run = _canary()
        call, calls = _caller(
            {
                "rollback": _always(412),
                "pre-rollout": _always(200),
                "rollout": _always(200),
                "confirm-traffic-increase": _always(200),
                "confirm-promotion": iter([412, 200]),
            }
        )
        weights = []
        while run.decided_at_tick is None:
            run.tick(call)
            weights.append(run.canary_weight)
        assert weights == [10, 20, 30, 40, 50, 50, 50]
        assert run.phase == "Promoting" and run.decided_at_tick == 7
        assert calls[:3] == ["rollback", "pre-rollout", "confirm-traffic-increase"]
        assert calls[3:6] == ["rollback", "rollout", "confirm-traffic-increase"]
        # the first refused promotion waits (WaitingPromotion): no traffic increase asked then
        assert calls[-3:] == ["rollback", "rollout", "confirm-promotion"]
        run.tick(call)
        run.tick(call)
        assert _phase(run) == "Succeeded" and run.canary_weight == 0

    def test_held_weight_repeats_pre_rollout_and_counts_no_failure(self) -> None:
        """A refused traffic increase at weight 0 holds it: the next iteration runs
        pre-rollout again, and no check has failed."""
        run = _canary()
        call, calls = _caller(
            {
                "rollback": _always(412),
                "pre-rollout": _always(200),
                "confirm-traffic-increase": _always(412),
            }
        )
        for _ in range(3):
            run.tick(call)
        assert run.canary_weight == 0 and run.failed_checks == 0
        assert calls.count("pre-rollout") == 3 and "rollout" not in calls

    def test_threshold_failed_checks_roll_back(self) -> None:
        """Each refused rollout check adds a failed check; at threshold the next iteration
        rolls back, before any other webhook."""
        run = _canary()
        call, _ = _caller(
            {
                "rollback": _always(412),
                "pre-rollout": _always(200),
                "rollout": _always(412),
                "confirm-traffic-increase": _always(200),
            }
        )
        run.tick(call)
        for _ in range(5):
            run.tick(call)
        assert run.failed_checks == 5 and run.phase == "Progressing"
        run.tick(call)
        assert _phase(run) == "Failed" and run.decided_at_tick == 7
        assert run.max_weight_reached == 10 and run.canary_weight == 0
        assert run.reason == "failed checks threshold reached 5"

    def test_rollback_hook_rolls_back_at_once(self) -> None:
        """A 2xx from the rollback webhook rolls back in that iteration."""
        run = _canary()
        call, calls = _caller(
            {
                "rollback": iter([412, 200]),
                "pre-rollout": _always(200),
                "confirm-traffic-increase": _always(200),
            }
        )
        run.tick(call)
        run.tick(call)
        assert run.phase == "Failed" and run.decided_at_tick == 2
        assert calls[-1] == "rollback"

    def test_status_rules(self) -> None:
        """Up to 202 is a pass; no answer or anything above fails; 5xx but 501 is retried."""
        assert flagger.HookAnswer(202).ok and not flagger.HookAnswer(204).ok
        assert not flagger.HookAnswer(None).ok
        assert flagger.retried(503) and flagger.retried(None) and not flagger.retried(501)
        assert not flagger.retried(412)


class TestArms:
    def test_healthy_arms_agree_and_other_text_parts(self) -> None:
        """Both arms answer a prompt with the same words; an arm drawing other text parts
        from them at some word and keeps the length."""
        baseline = ArmModel(ArmBehaviour(0.06), "baseline", 0)
        other = ArmModel(
            ArmBehaviour(0.036, speculative=True, other_text_share=1.0), "speculative", 0
        )
        expected = answer_words("prompt", 48)
        assert baseline.draw("prompt", 48).words == expected
        parted = other.draw("prompt", 48).words
        assert parted != expected and len(parted) == len(expected) and parted[-1] == OTHER_WORD

    def test_speculative_steps_are_consistent_with_vllms_figures(self) -> None:
        """Chunks carry every token after the first; the per-request metrics read back
        through canaryd's vLLM parser as the steps drawn."""
        model = ArmModel(ArmBehaviour(0.036, speculative=True), "speculative", 3)
        answer = model.draw("a prompt", 64)
        assert sum(answer.steps) == len(answer.words) - 1
        stats = acceptance.vllm_request_stats(
            {"speculative_decoding": spec_decode_metrics(answer.accepted)}
        )
        assert stats is not None and stats.verify_steps == len(answer.accepted)
        assert stats.accepted_tokens == sum(answer.accepted)

    def test_stall_slows_its_arm_until_its_owner_ends(self) -> None:
        """A stall opened on one arm multiplies that arm's delays (its concurrent requests
        too), not the other's, and ends with the request that opened it."""
        stalls = StallSchedule(1.0, arms="speculative", low=5.0, high=5.0)
        owner = stalls.begin("speculative")
        other = stalls.begin("speculative")  # in flight on the stalled arm
        assert stalls.factor("speculative") == 5.0 and stalls.factor("baseline") == 1.0
        stalls.end("speculative", other, slowed=True)
        assert stalls.factor("speculative") == 5.0
        stalls.end("speculative", owner, slowed=True)
        assert stalls.factor("speculative") == 1.0
        assert stalls.stalls == 1 and stalls.stalled_requests["speculative"] == 2

    def test_stalls_stay_near_their_share(self) -> None:
        """However long a stall lasts, no new one opens while the requests slowed exceed
        the share of the pairs so far."""
        stalls = StallSchedule(0.02, seed=1)
        for _ in range(5000):
            for arm in ("baseline", "speculative"):
                request = stalls.begin(arm)
                stalls.end(arm, request, slowed=stalls.factor(arm) > 1.0)
        assert sum(stalls.stalled_requests.values()) <= 0.02 * 5000 + 2


class TestScenarios:
    def test_expectations(self) -> None:
        """Healthy scenarios expect a promotion within count; faults a rollback within 15
        minutes below 10 % weight; the kill switch an end within 2 minutes."""
        assert SCENARIOS["healthy"].expected("argo").startswith("Successful within 45")
        assert "never past 10 %" in SCENARIOS["http500-5pct"].expected("flagger")
        assert SCENARIOS["kill-switch"].within_minutes == 2.0
        assert SCENARIOS["healthy-stalls"].stall_share == 0.02

    def test_go_durations(self) -> None:
        """Argo's and Flagger's intervals and timeouts are Go durations."""
        assert (seconds("1m"), seconds("10s"), seconds("1h30m"), seconds("0")) == (
            60.0,
            10.0,
            5400.0,
            0.0,
        )
        with pytest.raises(ValueError, match="Go duration"):
            seconds("1 minute")


class TestRunConfig:
    @pytest.mark.parametrize("tool", ["argo", "flagger"])
    def test_shipped_config_pointed_at_loopback(self, tool: str, tmp_path: Path) -> None:
        """The example's canaryd.toml keeps its settings; only the arms' URLs, the paths,
        the listen address and the telemetry sources (a direct scrape, the stable's of its
        own server) change, and the TOML written reads back as the same configuration."""
        base, source = shipped(EXAMPLES, tool)
        assert source.endswith(f"{tool}/canaryd.toml")
        urls = {"baseline": "http://127.0.0.1:1", "speculative": "http://127.0.0.1:2"}
        stables = {"speculative": "http://127.0.0.1:3"}
        config = run_config(
            base, urls, 9466, tmp_path, telemetry=True, stables=stables, extra="[gates.x]\ny = 1\n"
        )
        assert config["arms"]["speculative"]["base_url"] == urls["speculative"]
        assert config["arms"]["speculative"]["model"] == base["arms"]["speculative"]["model"]
        assert config["storage"]["url"] == f"sqlite:///{tmp_path / 'canaryd.db'}"
        assert config["server"]["listen"] == "127.0.0.1:9466"
        assert config["telemetry"]["arms"]["baseline"] == {
            "kind": "vllm", "metrics_url": "http://127.0.0.1:1/metrics",
        }  # fmt: skip
        assert config["telemetry"]["arms"]["speculative"]["stable"] == {
            "metrics_url": "http://127.0.0.1:3/metrics"
        }
        with pytest.raises(ValueError, match="names a stable for 'speculative'"):
            run_config(base, urls, 9466, tmp_path, telemetry=True)
        assert config["telemetry"]["scrape_interval_s"] == base["telemetry"]["scrape_interval_s"]
        assert config["gates"]["x"] == {"y": 1}
        assert tomllib.loads(toml_text(config)) == config

    def test_no_telemetry(self, tmp_path: Path) -> None:
        """--no-telemetry drops the section the example ships."""
        base, _ = shipped(EXAMPLES, "argo")
        urls = {"baseline": "http://a", "speculative": "http://b"}
        assert "telemetry" not in run_config(base, urls, 1, tmp_path, telemetry=False)
