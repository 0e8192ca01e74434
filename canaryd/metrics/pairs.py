"""The pair series: what one prompt sent to both arms looks like from outside.

`PairMetrics` owns the pair counter (by outcome), each arm's latencies (TTFT, TPOT, the
gap before every token, end-to-end), output tokens and errors, the speculative arms'
acceptance (per verify step, per draft position, and the steps that fell back),
and the comparison of each pair: speedup, token-for-token consistency, greedy
divergences and the task-score delta. Speculative figures carry the arm's configured
name, so comparison arms sit beside the switch's arm. Figures an engine did not report
are counted as "not reported", never observed as zeros. It also counts the answers a
read cap cut short (`canaryd_read_caps_total`): generations past their byte cap, seen
here, and the capability probe's capped answers, which the probe job reports.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from canaryd.metrics.declare import Declarer
from canaryd.metrics.labels import (
    ACCEPTANCE_LENGTH_BUCKETS,
    ITL_BUCKETS,
    LATENCY_BUCKETS,
    PAIR_OUTCOMES,
    QUALITY_DELTA_BUCKETS,
    SPEEDUP_BUCKETS,
    TPOT_BUCKETS,
    BoundedLabel,
    pair_outcome,
    position_label,
)
from engine.sse import over_output_cap
from engine.types import ErrorKind, GenerationResult
from gates.config import QualityGateConfig
from gates.records import PairRecord

# What cut an answer short: a generation's stream past its byte cap (`invalid_output`),
# or a capability probe's answer past its byte cap or its deadline.
READ_CAPS: Final = ("generation_bytes", "probe_answer_bytes", "probe_deadline")


class PairMetrics:
    """The series each finished pair moves, under bounded `category` and `arm` labels.

    `known_categories` get their pair counters pre-created (reading 0, not "absent").
    """

    def __init__(
        self,
        declare: Declarer,
        *,
        category: BoundedLabel,
        arm: BoundedLabel,
        known_categories: Iterable[str] = (),
    ) -> None:
        self._category = category
        self._arm = arm
        # The quality gate's tie margin, for the divergence counter (the daemon sets it).
        self.tie_margin_nats = QualityGateConfig().tie_margin_nats
        self.pairs = declare.counter(
            "canaryd_pairs_total",
            "Pairs run, by which arms produced a usable result (a prompt sent to several "
            "speculative arms counts once, by the outcome of the switch's arm).",
            ("category", "outcome"),
            'sum by (category) (rate(canaryd_pairs_total{outcome!="complete"}[15m]))'
            " / sum by (category) (rate(canaryd_pairs_total[15m]))",
        )
        self.ttft = declare.histogram(
            "canaryd_ttft_seconds",
            "Time to first token of successful generations.",
            ("arm", "category"),
            "histogram_quantile(0.99, sum by (arm, le) (rate(canaryd_ttft_seconds_bucket[1h])))",
            LATENCY_BUCKETS,
        )
        self.tpot = declare.histogram(
            "canaryd_tpot_seconds",
            "Mean time per output token after the first, per successful generation.",
            ("arm", "category"),
            "histogram_quantile(0.5, sum by (arm, le) (rate(canaryd_tpot_seconds_bucket[1h])))",
            TPOT_BUCKETS,
        )
        self.itl = declare.histogram(
            "canaryd_itl_seconds",
            "Inter-token latency of successful generations: one observation per output "
            "token after the first, the gap since the token before it as the reader "
            "received it (0 for the other tokens of a verify step's burst or a chunk).",
            ("arm", "category"),
            "histogram_quantile(0.99, sum by (arm, le) (rate(canaryd_itl_seconds_bucket[1h])))",
            ITL_BUCKETS,
        )
        self.e2e = declare.histogram(
            "canaryd_e2e_seconds",
            "End-to-end time of successful generations.",
            ("arm", "category"),
            "histogram_quantile(0.99, sum by (arm, category, le)"
            " (rate(canaryd_e2e_seconds_bucket[1h])))",
            LATENCY_BUCKETS,
        )
        self.output_tokens = declare.counter(
            "canaryd_output_tokens_total",
            "Output tokens of successful generations.",
            ("arm", "category"),
            "sum by (arm) (rate(canaryd_output_tokens_total[15m]))"
            " / sum by (arm) (rate(canaryd_e2e_seconds_sum[15m]))",
        )
        self.errors = declare.counter(
            "canaryd_errors_total",
            "Failed generations, by arm and error kind (timeout, http, connection, oom, "
            "invalid, invalid_output, internal).",
            ("arm", "kind"),
            "sum by (arm) (rate(canaryd_errors_total[15m]))",
        )
        self.read_caps = declare.counter(
            "canaryd_read_caps_total",
            "Answers cut short by a read cap, by cap: generation_bytes (a generation "
            "streamed past its byte cap, counted as invalid_output), probe_answer_bytes and "
            "probe_deadline (a capability probe's answer past its byte cap or its deadline).",
            ("what",),
            "sum by (what) (increase(canaryd_read_caps_total[1h])) > 0",
        )
        self.acceptance_length = declare.histogram(
            "canaryd_speculative_acceptance_length",
            "Tokens per verify step of successful speculative generations (1 + accepted "
            "tokens / verify steps, 1 ... k+1); only when the engine reports acceptance.",
            ("arm", "category"),
            "histogram_quantile(0.5, sum by (arm, category, le)"
            " (rate(canaryd_speculative_acceptance_length_bucket[1h])))",
            ACCEPTANCE_LENGTH_BUCKETS,
        )
        self.accepted_tokens = declare.counter(
            "canaryd_speculative_accepted_tokens_total",
            "Drafted tokens the target model accepted (also from engines that do not "
            "report how many they drafted).",
            ("arm", "category"),
            "sum by (arm, category) (increase(canaryd_speculative_accepted_tokens_total[1h]))",
        )
        # Some servers report accepted tokens and steps but not drafted tokens; their
        # accepted tokens must stay out of the acceptance rate's numerator, as their
        # (unknown) drafted tokens are out of its denominator.
        self.accepted_of_drafted_tokens = declare.counter(
            "canaryd_speculative_accepted_of_drafted_tokens_total",
            "Accepted tokens of generations whose engine also reported drafted tokens: the "
            "numerator of the acceptance rate.",
            ("arm", "category"),
            "sum by (arm, category)"
            " (rate(canaryd_speculative_accepted_of_drafted_tokens_total[1h]))"
            " / sum by (arm, category) (rate(canaryd_speculative_draft_tokens_total[1h]))",
        )
        self.draft_tokens = declare.counter(
            "canaryd_speculative_draft_tokens_total",
            "Tokens the draft proposed for verification; only from engines that report it "
            "(not counted as zero otherwise).",
            ("arm", "category"),
            "sum by (arm, category) (increase(canaryd_speculative_draft_tokens_total[1h]))",
        )
        self.verify_steps = declare.counter(
            "canaryd_speculative_verify_steps_total",
            "Target-model verify steps (each emits the accepted tokens plus one bonus token).",
            ("arm", "category"),
            "1 + sum by (arm, category) (rate(canaryd_speculative_accepted_tokens_total[1h]))"
            " / sum by (arm, category) (rate(canaryd_speculative_verify_steps_total[1h]))",
        )
        self.fallback_steps = declare.counter(
            "canaryd_speculative_fallback_steps_total",
            "Verify steps of successful speculative generations whose engine reports "
            "acceptance per position, by outcome: fallback (no draft token kept, or no "
            "draft: one token from the target) or accepted (at least one kept).",
            ("arm", "category", "outcome"),
            'sum by (arm) (rate(canaryd_speculative_fallback_steps_total{outcome="fallback"}'
            "[1h])) / sum by (arm) (rate(canaryd_speculative_fallback_steps_total[1h]))",
        )
        self.acceptance_not_reported = declare.counter(
            "canaryd_speculative_acceptance_not_reported_total",
            "Successful speculative generations whose engine reported no acceptance figures "
            "(counted here instead of observed as zeros).",
            ("arm", "category"),
            "sum by (arm) (rate(canaryd_speculative_acceptance_not_reported_total[1h]))",
        )
        self.position_accepted = declare.counter(
            "canaryd_speculative_position_accepted_total",
            "Verify steps whose draft token at this 1-based position was accepted "
            '(positions past 15 share "16+"); only from engines that report drafts '
            "per position.",
            ("arm", "position"),
            "sum by (arm, position) (rate(canaryd_speculative_position_accepted_total[1h]))"
            " / sum by (arm, position) (rate(canaryd_speculative_position_drafted_total[1h]))",
        )
        self.position_drafted = declare.counter(
            "canaryd_speculative_position_drafted_total",
            "Verify steps that drafted a token at this 1-based position.",
            ("arm", "position"),
            "sum by (arm, position) (increase(canaryd_speculative_position_drafted_total[1h]))",
        )
        self.speedup = declare.histogram(
            "canaryd_speedup_ratio",
            "Baseline end-to-end time over speculative end-to-end time of complete pairs "
            "(above 1: speculation is faster).",
            ("arm", "category"),
            "histogram_quantile(0.5, sum by (arm, category, le)"
            " (rate(canaryd_speedup_ratio_bucket[1h])))",
            SPEEDUP_BUCKETS,
        )
        self.pairs_compared = declare.counter(
            "canaryd_pairs_compared_total",
            "Complete pairs whose outputs were compared token by token.",
            ("arm", "category"),
            "sum by (arm, category) (rate(canaryd_pairs_exact_match_total[1h]))"
            " / sum by (arm, category) (rate(canaryd_pairs_compared_total[1h]))",
        )
        self.pairs_exact_match = declare.counter(
            "canaryd_pairs_exact_match_total",
            "Compared pairs whose two outputs were token-for-token identical.",
            ("arm", "category"),
            "1 - sum(increase(canaryd_pairs_exact_match_total[1d]))"
            " / sum(increase(canaryd_pairs_compared_total[1d]))",
        )
        self.greedy_divergences = declare.counter(
            "canaryd_greedy_divergences_total",
            "Greedy pairs whose outputs differ, by the baseline model's judgement of the "
            "first divergent token: tie (both tokens within gates.quality.tie_margin_nats: "
            "bf16 numerics, not counted by the quality gate), real (counted), unjudged (no "
            "teacher score: counted).",
            ("arm", "category", "judgement"),
            "sum by (arm, judgement) (increase(canaryd_greedy_divergences_total[1h]))",
        )
        self.task_score_delta = declare.histogram(
            "canaryd_task_score_delta",
            "Quality delta of complete pairs: speculative minus baseline task score (0..1 "
            "each, so -1..1); only for prompts with a check or reference.",
            ("arm", "category"),
            "histogram_quantile(0.1, sum by (arm, category, le)"
            " (rate(canaryd_task_score_delta_bucket[1d])))",
            QUALITY_DELTA_BUCKETS,
        )
        for known in known_categories:
            for outcome in PAIR_OUTCOMES:
                self.pairs.labels(category=known, outcome=outcome)
        for what in READ_CAPS:
            self.read_caps.labels(what=what)

    def read_capped(self, what: str, n: int = 1) -> None:
        """Count `n` answers cut short by the read cap `what` (one of `READ_CAPS`)."""
        if what in READ_CAPS and n > 0:
            self.read_caps.labels(what=what).inc(n)

    def add_arm(self, arm: str) -> None:
        """Create `arm`'s error series (reading 0) for every error kind."""
        for kind in ErrorKind:
            if kind is not ErrorKind.NONE:
                self.errors.labels(arm=arm, kind=kind.value)

    def remove_arm(self, arm: str) -> None:
        """Remove the error series of an arm no longer configured."""
        for kind in ErrorKind:
            if kind is not ErrorKind.NONE:
                self.errors.remove(arm, kind.value)

    def observe_group(self, records: Sequence[PairRecord]) -> None:
        """Count one prompt sent to one or several speculative arms: both arms' timings
        and errors, each speculative arm's acceptance, and each pair's speedup,
        consistency and quality delta. The records share the baseline, which is counted
        once, as is the prompt (by the first record's outcome: the switch's arm comes
        first); each speculative arm is counted under its name."""
        if not records:
            return
        first = records[0]
        category = self._category(first.prompt.category)
        self.pairs.labels(category=category, outcome=pair_outcome(first)).inc()
        self._observe_arm("baseline", category, first.baseline)
        for record in records:
            self._observe_speculative(self._arm(record.arm), category, record)

    def _observe_speculative(self, arm: str, category: str, record: PairRecord) -> None:
        self._observe_arm(arm, category, record.speculative)
        if record.speculative.ok:
            self._observe_acceptance(arm, category, record.speculative)
        speedup = record.speedup
        if speedup is not None:
            self.speedup.labels(arm=arm, category=category).observe(speedup)
        scores = record.scores
        if record.complete and scores is not None:
            self.pairs_compared.labels(arm=arm, category=category).inc()
            if scores.exact_match:
                self.pairs_exact_match.labels(arm=arm, category=category).inc()
            elif record.temperature <= 0.0:
                judgement = "real"
                if scores.divergence_margin is None:
                    judgement = "unjudged"
                elif scores.tie(self.tie_margin_nats):
                    judgement = "tie"
                self.greedy_divergences.labels(
                    arm=arm, category=category, judgement=judgement
                ).inc()
            if scores.task_score_delta is not None:
                self.task_score_delta.labels(arm=arm, category=category).observe(
                    scores.task_score_delta
                )

    def _observe_arm(self, arm: str, category: str, result: GenerationResult) -> None:
        if not result.ok:
            # A failure's duration is time-to-failure, not a latency: it would drag the
            # latency distribution toward the timeout. Errors are counted instead.
            self.errors.labels(arm=arm, kind=result.error.value).inc()
            if over_output_cap(result):
                self.read_caps.labels(what="generation_bytes").inc()
            return
        if result.ttft_s is not None:
            self.ttft.labels(arm=arm, category=category).observe(result.ttft_s)
        if result.tpot_s is not None:
            self.tpot.labels(arm=arm, category=category).observe(result.tpot_s)
        self.e2e.labels(arm=arm, category=category).observe(result.e2e_s)
        if result.itl is not None:
            itl = self.itl.labels(arm=arm, category=category)
            for gap in result.itl.token_gaps():
                itl.observe(gap)
        self.output_tokens.labels(arm=arm, category=category).inc(result.output_tokens)

    def _observe_acceptance(self, arm: str, category: str, result: GenerationResult) -> None:
        stats = result.speculative
        labels = {"arm": arm, "category": category}
        if stats is None:
            self.acceptance_not_reported.labels(**labels).inc()
            return
        self.accepted_tokens.labels(**labels).inc(stats.accepted_tokens)
        if stats.draft_tokens is not None:
            self.draft_tokens.labels(**labels).inc(stats.draft_tokens)
            self.accepted_of_drafted_tokens.labels(**labels).inc(stats.accepted_tokens)
        self.verify_steps.labels(**labels).inc(stats.verify_steps)
        length = result.acceptance_length
        if length is not None:
            self.acceptance_length.labels(**labels).observe(length)
        if stats.fallback_rate is not None:
            kept = stats.accepted_per_position[0]
            self.fallback_steps.labels(**labels, outcome="accepted").inc(kept)
            self.fallback_steps.labels(**labels, outcome="fallback").inc(stats.verify_steps - kept)
        # Accepted without drafted per position would make a rate with no denominator,
        # and drafted without accepted would count unreported acceptances as zeros: count
        # positions only when the engine reports both (an empty tuple is "not reported").
        if stats.drafted_per_position and stats.accepted_per_position:
            for index, drafted in enumerate(stats.drafted_per_position):
                accepted = (
                    stats.accepted_per_position[index]
                    if index < len(stats.accepted_per_position)
                    else 0
                )
                position = position_label(index + 1)
                self.position_drafted.labels(arm=arm, position=position).inc(drafted)
                self.position_accepted.labels(arm=arm, position=position).inc(accepted)
