"""canaryd's Prometheus metrics: what a pair, a cycle and the store look like from outside.

`CanarydMetrics` owns one `CollectorRegistry` (never the process-global default, so two
instances — two tests — never share series) and turns each finished `PairRecord` into
counter increments and histogram observations. Every label value comes from a bounded
set: `arm` (`baseline`, or a speculative arm's configured name: `speculative` when
there is one; the speculative arms' figures — acceptance, speedup, consistency,
quality — carry it too, so comparison arms sit beside the switch's arm), `category`
(the suites' categories, capped, the rest folded into `other`), `outcome`, `kind` (an
`ErrorKind`, or a capped store error kind) and `position` (1 … 15, then `16+`); for
gates and the switch, `gate` (capped at 16), `state`
(the five gate states), `target`, `actor_kind` and `actuator`. Figures an engine did not
report are counted as "not reported", never observed as zeros. `canaryd_build_info`
exports only an allowlist of each engine's identity (`BUILD_IDENTITY_KEYS`), its
`base_url` reduced to scheme, host, port and path, so no credential reaches a label.
`metrics_reference()`
renders the table that docs/metrics.md carries verbatim, from the same declarations that
build the registry. The label sets and bucket bounds are `canaryd.metrics.labels`'.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)

from canaryd.metrics.labels import (
    ACCEPTANCE_LENGTH_BUCKETS,
    ACTOR_KINDS,
    ACTUATORS,
    BUILD_IDENTITY_KEYS,
    BUILD_KEYS_MAX,
    BUILD_VALUE_MAX,
    CHECK_VALUE,
    GATE_STATES,
    LABEL_NAME,
    LABEL_VALUE,
    LATENCY_BUCKETS,
    MAX_POSITION_LABEL,
    OTHER,
    PAIR_OUTCOMES,
    PROBE_STATES,
    QUALITY_DELTA_BUCKETS,
    SPEEDUP_BUCKETS,
    SWITCH_TARGETS,
    TPOT_BUCKETS,
    URL_IDENTITY_KEYS,
    BoundedLabel,
    MetricDoc,
    MetricType,
    PairOutcome,
    pair_outcome,
    position_label,
)
from canaryd.redact import public_url, redact_text
from engine.types import ErrorKind, GenerationResult
from gates.config import QualityGateConfig
from gates.records import ARMS, PairRecord

__all__ = [
    "ACCEPTANCE_LENGTH_BUCKETS",
    "BUILD_IDENTITY_KEYS",
    "LATENCY_BUCKETS",
    "MAX_POSITION_LABEL",
    "OTHER",
    "QUALITY_DELTA_BUCKETS",
    "SPEEDUP_BUCKETS",
    "TPOT_BUCKETS",
    "CanarydMetrics",
    "PairOutcome",
    "metrics_reference",
    "pair_outcome",
    "position_label",
]


class CanarydMetrics:
    """Every canaryd metric, in one registry of its own.

    `categories` are the suites' categories (pre-created so their pair counters read 0,
    not "absent"); categories seen later are admitted up to `max_categories` in all, the
    rest counted under `other`. All methods are thread-safe.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        categories: Iterable[str] = (),
        max_categories: int = 64,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        # The quality gate's tie margin, for the divergence counter (the daemon sets it).
        self.tie_margin_nats = QualityGateConfig().tie_margin_nats
        self.reference: list[MetricDoc] = []
        known = sorted({c for c in categories if LABEL_VALUE.match(c)})
        self._category = BoundedLabel(max_categories, known)
        self._store_error_kind = BoundedLabel(16)
        # Arm names are validated by the configuration; the bound guards other callers.
        self._arm = BoundedLabel(16, ARMS)

        self.pairs = self._counter(
            "canaryd_pairs_total",
            "Pairs run, by which arms produced a usable result (a prompt sent to several "
            "speculative arms counts once, by the outcome of the switch's arm).",
            ("category", "outcome"),
            'sum by (category) (rate(canaryd_pairs_total{outcome!="complete"}[15m]))'
            " / sum by (category) (rate(canaryd_pairs_total[15m]))",
        )
        self.ttft = self._histogram(
            "canaryd_ttft_seconds",
            "Time to first token of successful generations.",
            ("arm", "category"),
            "histogram_quantile(0.99, sum by (arm, le) (rate(canaryd_ttft_seconds_bucket[1h])))",
            LATENCY_BUCKETS,
        )
        self.tpot = self._histogram(
            "canaryd_tpot_seconds",
            "Mean time per output token after the first, per successful generation.",
            ("arm", "category"),
            "histogram_quantile(0.5, sum by (arm, le) (rate(canaryd_tpot_seconds_bucket[1h])))",
            TPOT_BUCKETS,
        )
        self.e2e = self._histogram(
            "canaryd_e2e_seconds",
            "End-to-end time of successful generations.",
            ("arm", "category"),
            "histogram_quantile(0.99, sum by (arm, category, le)"
            " (rate(canaryd_e2e_seconds_bucket[1h])))",
            LATENCY_BUCKETS,
        )
        self.output_tokens = self._counter(
            "canaryd_output_tokens_total",
            "Output tokens of successful generations.",
            ("arm", "category"),
            "sum by (arm) (rate(canaryd_output_tokens_total[15m]))"
            " / sum by (arm) (rate(canaryd_e2e_seconds_sum[15m]))",
        )
        self.errors = self._counter(
            "canaryd_errors_total",
            "Failed generations, by arm and error kind (timeout, http, connection, oom, "
            "invalid, internal).",
            ("arm", "kind"),
            "sum by (arm) (rate(canaryd_errors_total[15m]))",
        )
        self.acceptance_length = self._histogram(
            "canaryd_speculative_acceptance_length",
            "Tokens per verify step of successful speculative generations (1 + accepted "
            "tokens / verify steps, 1 ... k+1); only when the engine reports acceptance.",
            ("arm", "category"),
            "histogram_quantile(0.5, sum by (arm, category, le)"
            " (rate(canaryd_speculative_acceptance_length_bucket[1h])))",
            ACCEPTANCE_LENGTH_BUCKETS,
        )
        self.accepted_tokens = self._counter(
            "canaryd_speculative_accepted_tokens_total",
            "Drafted tokens the target model accepted (also from engines that do not "
            "report how many they drafted).",
            ("arm", "category"),
            "sum by (arm, category) (increase(canaryd_speculative_accepted_tokens_total[1h]))",
        )
        # Some servers report accepted tokens and steps but not drafted tokens; their
        # accepted tokens must stay out of the acceptance rate's numerator, as their
        # (unknown) drafted tokens are out of its denominator.
        self.accepted_of_drafted_tokens = self._counter(
            "canaryd_speculative_accepted_of_drafted_tokens_total",
            "Accepted tokens of generations whose engine also reported drafted tokens: the "
            "numerator of the acceptance rate.",
            ("arm", "category"),
            "sum by (arm, category)"
            " (rate(canaryd_speculative_accepted_of_drafted_tokens_total[1h]))"
            " / sum by (arm, category) (rate(canaryd_speculative_draft_tokens_total[1h]))",
        )
        self.draft_tokens = self._counter(
            "canaryd_speculative_draft_tokens_total",
            "Tokens the draft proposed for verification; only from engines that report it "
            "(not counted as zero otherwise).",
            ("arm", "category"),
            "sum by (arm, category) (increase(canaryd_speculative_draft_tokens_total[1h]))",
        )
        self.verify_steps = self._counter(
            "canaryd_speculative_verify_steps_total",
            "Target-model verify steps (each emits the accepted tokens plus one bonus token).",
            ("arm", "category"),
            "1 + sum by (arm, category) (rate(canaryd_speculative_accepted_tokens_total[1h]))"
            " / sum by (arm, category) (rate(canaryd_speculative_verify_steps_total[1h]))",
        )
        self.acceptance_not_reported = self._counter(
            "canaryd_speculative_acceptance_not_reported_total",
            "Successful speculative generations whose engine reported no acceptance figures "
            "(counted here instead of observed as zeros).",
            ("arm", "category"),
            "sum by (arm) (rate(canaryd_speculative_acceptance_not_reported_total[1h]))",
        )
        self.position_accepted = self._counter(
            "canaryd_speculative_position_accepted_total",
            "Verify steps whose draft token at this 1-based position was accepted "
            '(positions past 15 share "16+"); only from engines that report drafts '
            "per position.",
            ("arm", "position"),
            "sum by (arm, position) (rate(canaryd_speculative_position_accepted_total[1h]))"
            " / sum by (arm, position) (rate(canaryd_speculative_position_drafted_total[1h]))",
        )
        self.position_drafted = self._counter(
            "canaryd_speculative_position_drafted_total",
            "Verify steps that drafted a token at this 1-based position.",
            ("arm", "position"),
            "sum by (arm, position) (increase(canaryd_speculative_position_drafted_total[1h]))",
        )
        self.speedup = self._histogram(
            "canaryd_speedup_ratio",
            "Baseline end-to-end time over speculative end-to-end time of complete pairs "
            "(above 1: speculation is faster).",
            ("arm", "category"),
            "histogram_quantile(0.5, sum by (arm, category, le)"
            " (rate(canaryd_speedup_ratio_bucket[1h])))",
            SPEEDUP_BUCKETS,
        )
        self.pairs_compared = self._counter(
            "canaryd_pairs_compared_total",
            "Complete pairs whose outputs were compared token by token.",
            ("arm", "category"),
            "sum by (arm, category) (rate(canaryd_pairs_exact_match_total[1h]))"
            " / sum by (arm, category) (rate(canaryd_pairs_compared_total[1h]))",
        )
        self.pairs_exact_match = self._counter(
            "canaryd_pairs_exact_match_total",
            "Compared pairs whose two outputs were token-for-token identical.",
            ("arm", "category"),
            "1 - sum(increase(canaryd_pairs_exact_match_total[1d]))"
            " / sum(increase(canaryd_pairs_compared_total[1d]))",
        )
        self.greedy_divergences = self._counter(
            "canaryd_greedy_divergences_total",
            "Greedy pairs whose outputs differ, by the baseline model's judgement of the "
            "first divergent token: tie (both tokens within gates.quality.tie_margin_nats: "
            "bf16 numerics, not counted by the quality gate), real (counted), unjudged (no "
            "teacher score: counted).",
            ("arm", "category", "judgement"),
            "sum by (arm, judgement) (increase(canaryd_greedy_divergences_total[1h]))",
        )
        self.task_score_delta = self._histogram(
            "canaryd_task_score_delta",
            "Quality delta of complete pairs: speculative minus baseline task score (0..1 "
            "each, so -1..1); only for prompts with a check or reference.",
            ("arm", "category"),
            "histogram_quantile(0.1, sum by (arm, category, le)"
            " (rate(canaryd_task_score_delta_bucket[1d])))",
            QUALITY_DELTA_BUCKETS,
        )
        self.cycles = self._counter(
            "canaryd_cycles_total",
            "Pair cycles finished, by outcome (ok, failed).",
            ("outcome",),
            'increase(canaryd_cycles_total{outcome="failed"}[1h])',
        )
        self.last_cycle = self._gauge(
            "canaryd_last_cycle_timestamp_seconds",
            "Unix time the last pair cycle finished, whatever its outcome.",
            (),
            "time() - canaryd_last_cycle_timestamp_seconds",
        )
        self.last_cycle_success = self._gauge(
            "canaryd_last_cycle_success_timestamp_seconds",
            "Unix time the last pair cycle finished successfully.",
            (),
            "time() - canaryd_last_cycle_success_timestamp_seconds > 600",
        )
        self.gate_runs = self._counter(
            "canaryd_gate_runs_total",
            "Gate runs finished, by outcome (ok; failed: the run raised, judged nothing and "
            "did not confirm the state file).",
            ("outcome",),
            'increase(canaryd_gate_runs_total{outcome="failed"}[15m])',
        )
        self.last_gate_run_success = self._gauge(
            "canaryd_last_gate_run_success_timestamp_seconds",
            "Unix time the last gate run completed (leader: judged and confirmed; follower: "
            "mirrored the leader's state).",
            (),
            "time() - canaryd_last_gate_run_success_timestamp_seconds > 300",
        )
        self.pair_interval = self._gauge(
            "canaryd_pair_interval_seconds",
            "Seconds between pair cycles now: schedule.pair_interval_s, or less while an "
            "enforce detector is past schedule.speed_up_at of its threshold.",
            (),
            "canaryd_pair_interval_seconds",
        )
        self.heartbeat_timestamp = self._gauge(
            "canaryd_heartbeat_timestamp_seconds",
            "Unix time of the daemon's last heartbeat.",
            (),
            "time() - canaryd_heartbeat_timestamp_seconds > 60",
        )
        self.engine_ready = self._gauge(
            "canaryd_engine_ready",
            "1 when the arm's engine is loaded and answering, else 0.",
            ("arm",),
            "min(canaryd_engine_ready) == 0",
        )
        self.store_errors = self._counter(
            "canaryd_store_errors_total",
            "Failed store operations, by kind (as the store names them, capped).",
            ("kind",),
            "sum by (kind) (increase(canaryd_store_errors_total[15m]))",
        )
        self.pairs_quarantined = self._counter(
            "canaryd_pairs_quarantined_total",
            "Pairs the database refused for their content (a number out of range, a value "
            "it cannot store), written to the quarantine file instead of the database.",
            (),
            "increase(canaryd_pairs_quarantined_total[1h]) > 0",
        )
        self.pairs_sanitised = self._counter(
            "canaryd_pairs_sanitised_total",
            "Pairs stored after their text was made storable (NUL characters replaced by U+FFFD).",
            (),
            "increase(canaryd_pairs_sanitised_total[1h])",
        )
        self.pending = self._gauge(
            "canaryd_store_pending_pairs",
            "Pairs held in memory because the database is unreachable.",
            (),
            "canaryd_store_pending_pairs > 0",
        )
        self.gate_state = self._gauge(
            "canaryd_gate_state",
            "1 for each gate's state in its latest evaluation, 0 for its other states "
            "(PASS, WARN, FAIL, INCONCLUSIVE, NODATA).",
            ("gate", "state"),
            'canaryd_gate_state{state="FAIL"} == 1',
        )
        self.gate_evaluations = self._counter(
            "canaryd_gate_evaluations_total",
            "Gate evaluations, by gate and the state it decided.",
            ("gate", "state"),
            'sum by (gate) (increase(canaryd_gate_evaluations_total{state="FAIL"}[1h]))',
        )
        self.detector_progress = self._gauge(
            "canaryd_gate_detector_progress",
            "Each check's sequential detector in the latest evaluation: its CUSUM statistic "
            "over the threshold it FAILs at (1: FAIL; 0.5: WARN; 0: no evidence of a fault).",
            ("check",),
            "max by (check) (canaryd_gate_detector_progress) > 0.5",
        )
        self.switch_rolled_back = self._gauge(
            "canaryd_switch_rolled_back",
            "1 while the rollback switch has speculative decoding disabled, else 0.",
            (),
            "canaryd_switch_rolled_back == 1",
        )
        self.switch_generation = self._gauge(
            "canaryd_switch_generation",
            "The switch state's generation; it only grows, by one per transition.",
            (),
            "changes(canaryd_switch_generation[1h])",
        )
        self.switch_latched = self._gauge(
            "canaryd_switch_latched",
            "1 when repeated automatic trips latched the switch (only a human can restore).",
            (),
            "canaryd_switch_latched == 1",
        )
        self.switch_category_rolled_back = self._gauge(
            "canaryd_switch_category_rolled_back",
            "1 while a category's own switch has speculative decoding disabled for it, else "
            "0; only categories ever moved on their own (the top level still rules all).",
            ("category",),
            "max by (category) (canaryd_switch_category_rolled_back) == 1",
        )
        self.switch_category_latched = self._gauge(
            "canaryd_switch_category_latched",
            "1 when repeated automatic trips latched a category's own switch (only a human "
            "can restore it).",
            ("category",),
            "canaryd_switch_category_latched == 1",
        )
        self.leader = self._gauge(
            "canaryd_leader",
            "1 while this daemon leads (runs the gates and writes the switch), else 0; "
            "of the daemons on one database, exactly one should read 1.",
            (),
            "sum(canaryd_leader) != 1",
        )
        self.switch_transitions = self._counter(
            "canaryd_switch_transitions_total",
            "Switch transitions, by target mode (auto, rolled_back) and who made them "
            "(gate, user).",
            ("target", "actor_kind"),
            'increase(canaryd_switch_transitions_total{target="rolled_back"}[1h])',
        )
        self.actuator_failures = self._counter(
            "canaryd_actuator_failures_total",
            "Failed attempts to apply the switch state, by actuator (state_file, command, "
            "webhook, alertmanager); the state itself is kept and re-applied.",
            ("actuator",),
            "sum by (actuator) (increase(canaryd_actuator_failures_total[15m])) > 0",
        )
        self.probe_capability = self._gauge(
            "canaryd_probe_capability_state",
            "1 for each capability's state on each arm in the latest capability probe, 0 "
            "for its other states (pass, fail, unsupported).",
            ("capability", "arm", "state"),
            'canaryd_probe_capability_state{state="pass"} == 0',
        )
        self.probe_regression = self._gauge(
            "canaryd_probe_regression",
            "1 when the latest capability probe found the speculative arm failing (or not "
            "supporting) a capability the baseline passes, else 0.",
            ("capability",),
            "canaryd_probe_regression == 1",
        )
        self.probe_runs = self._counter(
            "canaryd_probe_runs_total",
            "Capability probes, by outcome (parity, regression, failed: could not run).",
            ("outcome",),
            'increase(canaryd_probe_runs_total{outcome="failed"}[6h]) > 0',
        )
        self.last_probe = self._gauge(
            "canaryd_last_probe_timestamp_seconds",
            "Unix time the latest capability probe finished (parity or regression).",
            (),
            "time() - canaryd_last_probe_timestamp_seconds > 2 * 3600",
        )
        self.traffic_requests = self._counter(
            "canaryd_traffic_requests_total",
            "Requests the mirror sink received, by outcome: sampled (queued for a live "
            "pair), rate_limited, duplicate, too_long, categories, queue_full, "
            "unauthorized, too_large, unusable, not_found.",
            ("outcome",),
            'sum by (outcome) (rate(canaryd_traffic_requests_total{outcome!="sampled"}[5m]))',
        )
        self.traffic_queue = self._gauge(
            "canaryd_traffic_queue_depth",
            "Sampled live requests waiting for a pair.",
            (),
            "canaryd_traffic_queue_depth",
        )
        self.traffic_category_share = self._gauge(
            "canaryd_traffic_category_share",
            "Share of the mirrored requests of the last closed minute in each category "
            "(the traffic mix; categories beyond the label cap are summed under other).",
            ("category",),
            "canaryd_traffic_category_share",
        )
        self.traffic_prompt_chars = self._gauge(
            "canaryd_traffic_prompt_chars",
            "Mean prompt length (characters) of the live requests sampled in the last "
            "minute that sampled any.",
            (),
            "canaryd_traffic_prompt_chars",
        )
        self.traffic_repetition = self._gauge(
            "canaryd_traffic_ngram_repetition",
            "Mean share of repeated word 3-grams in the prompts of the live requests "
            "sampled in the last minute that sampled any (the reuse prompt lookup feeds "
            "on).",
            (),
            "canaryd_traffic_ngram_repetition",
        )
        self._gate_name = BoundedLabel(16)
        self._capability = BoundedLabel(16)
        self._check_name = BoundedLabel(64, pattern=CHECK_VALUE)  # drift: one per category
        build_doc = (
            "Versions of canaryd, Python, torch and transformers, and each arm's engine "
            "identity (baseline_*, speculative_*), as labels of one series of value 1."
        )
        self.build = Info("canaryd_build", build_doc, registry=self.registry)
        self._doc(
            "canaryd_build_info",
            "info",
            ("version", "python", "torch", "transformers", "baseline_*", "speculative_*"),
            build_doc,
            "count by (version) (canaryd_build_info)",
        )

        for category in known:
            for outcome in PAIR_OUTCOMES:
                self.pairs.labels(category=category, outcome=outcome)
        self._arm_series: set[str] = set()
        for arm in ARMS:
            self._add_arm(arm)
        for cycle_outcome in ("ok", "failed"):
            self.cycles.labels(outcome=cycle_outcome)
        for target in SWITCH_TARGETS:
            for actor_kind in ACTOR_KINDS:
                self.switch_transitions.labels(target=target, actor_kind=actor_kind)
        for actuator in ACTUATORS:
            self.actuator_failures.labels(actuator=actuator)
        for probe_outcome in ("parity", "regression", "failed"):
            self.probe_runs.labels(outcome=probe_outcome)
        self.switch_rolled_back.set(0)
        self.switch_latched.set(0)
        self.leader.set(0)

    # -- declaration helpers: each metric is declared once, with its documentation --

    def _doc(
        self, name: str, kind: MetricType, labels: Sequence[str], meaning: str, example: str
    ) -> None:
        self.reference.append(MetricDoc(name, kind, tuple(labels), meaning, example))

    def _counter(self, name: str, doc: str, labels: Sequence[str], example: str) -> Counter:
        self._doc(name, "counter", labels, doc, example)
        return Counter(name, doc, labels, registry=self.registry)

    def _gauge(self, name: str, doc: str, labels: Sequence[str], example: str) -> Gauge:
        self._doc(name, "gauge", labels, doc, example)
        return Gauge(name, doc, labels, registry=self.registry)

    def _histogram(
        self,
        name: str,
        doc: str,
        labels: Sequence[str],
        example: str,
        buckets: Sequence[float],
    ) -> Histogram:
        self._doc(name, "histogram", labels, doc, example)
        return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

    # -- what the daemon reports --

    def category_label(self, category: str) -> str:
        """The `category` label a prompt category is counted under."""
        return self._category(category)

    def observe_pair(self, record: PairRecord) -> None:
        """Count one finished pair: both arms' timings and errors, the speculative arm's
        acceptance, and the pair's speedup, consistency and quality delta."""
        self.observe_group((record,))

    def observe_group(self, records: Sequence[PairRecord]) -> None:
        """Count one prompt sent to several speculative arms: its records share the
        baseline, which is counted once, as is the prompt (by the first record's outcome:
        the switch's arm comes first); each speculative arm is counted under its name."""
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
            return
        if result.ttft_s is not None:
            self.ttft.labels(arm=arm, category=category).observe(result.ttft_s)
        if result.tpot_s is not None:
            self.tpot.labels(arm=arm, category=category).observe(result.tpot_s)
        self.e2e.labels(arm=arm, category=category).observe(result.e2e_s)
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

    def gate_run_finished(self, timestamp: float, ok: bool) -> None:
        """A gate run ended at `timestamp` (Unix seconds), completed (`ok`) or raised."""
        self.gate_runs.labels(outcome="ok" if ok else "failed").inc()
        if ok:
            self.last_gate_run_success.set(timestamp)

    def probe_finished(
        self,
        timestamp: float,
        states: Iterable[tuple[str, str, str]],
        regressions: Iterable[str],
    ) -> None:
        """A capability probe ended at `timestamp`: `(capability, arm, state)` for each
        cell of its table, and the capabilities the speculative arm regressed on."""
        regressed = set(regressions)
        capabilities = set()
        for capability, arm, state in states:
            label = self._capability(capability)
            capabilities.add(label)
            for candidate in PROBE_STATES:
                self.probe_capability.labels(
                    capability=label, arm=self._arm(arm), state=candidate
                ).set(1 if candidate == state else 0)
        for capability in capabilities:
            self.probe_regression.labels(capability=capability).set(
                1 if capability in regressed else 0
            )
        self.probe_runs.labels(outcome="regression" if regressed else "parity").inc()
        self.last_probe.set(timestamp)

    def probe_failed(self) -> None:
        """A capability probe could not run (an arm away, a baseline failing)."""
        self.probe_runs.labels(outcome="failed").inc()

    def cycle_finished(self, timestamp: float, ok: bool) -> None:
        """A pair cycle ended at `timestamp` (Unix seconds)."""
        self.cycles.labels(outcome="ok" if ok else "failed").inc()
        self.last_cycle.set(timestamp)
        if ok:
            self.last_cycle_success.set(timestamp)

    def store_error(self, kind: str) -> None:
        """A store operation failed; `kind` is a short lower-case identifier."""
        self.store_errors.labels(kind=self._store_error_kind(kind)).inc()

    def pair_quarantined(self) -> None:
        """A pair went to the quarantine file instead of the database."""
        self.pairs_quarantined.inc()

    def pair_sanitised(self) -> None:
        """A pair was stored with its text made storable."""
        self.pairs_sanitised.inc()

    def traffic_request(self, outcome: str, n: int = 1) -> None:
        """`n` mirrored requests ended as `outcome` (canaryd.traffic.sampling.OUTCOMES)."""
        self.traffic_requests.labels(outcome=outcome).inc(n)

    def traffic_mix(
        self, shares: Mapping[str, float], prompt_chars: float | None, repetition: float | None
    ) -> None:
        """The traffic mix of the last closed minute (the figures None when it sampled
        nothing keep their previous value)."""
        folded: dict[str, float] = {}
        for category, share in shares.items():
            label = self._category(category)
            folded[label] = folded.get(label, 0.0) + share
        self.traffic_category_share.clear()
        for label, share in folded.items():
            self.traffic_category_share.labels(category=label).set(share)
        if prompt_chars is not None:
            self.traffic_prompt_chars.set(prompt_chars)
        if repetition is not None:
            self.traffic_repetition.set(repetition)

    def heartbeat(self, timestamp: float) -> None:
        self.heartbeat_timestamp.set(timestamp)

    def set_engine_ready(self, arm: str, ready: bool) -> None:
        self.engine_ready.labels(arm=self._arm(arm)).set(1 if ready else 0)

    def set_arms(self, names: Iterable[str]) -> None:
        """The arms configured now (baseline included): their engine-ready and error
        series exist (reading 0), those of arms no longer configured are removed, so
        `min(canaryd_engine_ready)` never waits on an arm that is gone."""
        wanted = [self._arm(name) for name in names]
        for labels in list(self._arm_series):
            if labels not in wanted:
                self.engine_ready.remove(labels)
                for kind in ErrorKind:
                    if kind is not ErrorKind.NONE:
                        self.errors.remove(labels, kind.value)
                self._arm_series.discard(labels)
        for arm in wanted:
            if arm not in self._arm_series:
                self._add_arm(arm)

    def _add_arm(self, arm: str) -> None:
        for kind in ErrorKind:
            if kind is not ErrorKind.NONE:
                self.errors.labels(arm=arm, kind=kind.value)
        self.engine_ready.labels(arm=arm).set(0)
        self._arm_series.add(arm)

    def pending_pairs(self, n: int) -> None:
        """`n` pairs are buffered in memory, waiting for the database."""
        self.pending.set(n)

    def set_build_info(
        self,
        version: str,
        python: str,
        torch: str,
        transformers: str,
        baseline: dict[str, str],
        speculative: dict[str, str],
    ) -> None:
        """Replace the build info (one series; a config reload may change the engines).

        Of each engine identity only the `BUILD_IDENTITY_KEYS` are exported, URLs without
        userinfo, query or fragment, other values with any credential masked."""
        labels = {
            "version": version,
            "python": python,
            "torch": torch,
            "transformers": transformers,
        }
        for prefix, identity in (("baseline", baseline), ("speculative", speculative)):
            exported = sorted(key for key in identity if key in BUILD_IDENTITY_KEYS)
            for key in exported[:BUILD_KEYS_MAX]:
                name = f"{prefix}_{LABEL_NAME.sub('_', key).lower()}"
                value = str(identity[key])
                labels[name] = public_url(value) if key in URL_IDENTITY_KEYS else value
        self.build.info({k: redact_text(v)[:BUILD_VALUE_MAX] for k, v in labels.items()})

    def observe_gates(self, decisions: Iterable[tuple[str, str]]) -> None:
        """One evaluation's `(gate name, state)` pairs: count each, and set the state
        gauges (1 for the decided state, 0 for the gate's other states)."""
        for name, state in decisions:
            gate = self._gate_name(name)
            self.gate_evaluations.labels(gate=gate, state=state).inc()
            for candidate in GATE_STATES:
                self.gate_state.labels(gate=gate, state=candidate).set(
                    1 if candidate == state else 0
                )

    def observe_detectors(self, readings: Iterable[tuple[str, float]]) -> None:
        """One evaluation's `(check name, detector progress)` pairs."""
        for name, progress in readings:
            self.detector_progress.labels(check=self._check_name(name)).set(progress)

    def set_switch(
        self,
        *,
        rolled_back: bool,
        generation: int,
        latched: bool,
        categories: Iterable[tuple[str, bool, bool]] = (),
    ) -> None:
        """The switch as stored now; `categories`: (category, rolled back, latched) of each
        category's own switch."""
        self.switch_rolled_back.set(1 if rolled_back else 0)
        self.switch_generation.set(generation)
        self.switch_latched.set(1 if latched else 0)
        for category, category_rolled_back, category_latched in categories:
            label = self._category(category)
            self.switch_category_rolled_back.labels(category=label).set(
                1 if category_rolled_back else 0
            )
            self.switch_category_latched.labels(category=label).set(1 if category_latched else 0)

    def set_leader(self, leading: bool) -> None:
        """Whether this daemon leads the gates and the switch now."""
        self.leader.set(1 if leading else 0)

    def switch_transition(self, target: str, actor_kind: str) -> None:
        """A transition to `target` (auto, rolled_back) by a `gate` or a `user`."""
        self.switch_transitions.labels(target=target, actor_kind=actor_kind).inc()

    def actuator_failed(self, actuator: str) -> None:
        """One failed attempt of `actuator` (state_file, command, webhook, alertmanager)."""
        label = actuator if actuator in ACTUATORS else OTHER
        self.actuator_failures.labels(actuator=label).inc()

    def render(self) -> bytes:
        """The registry in the Prometheus text exposition format (0.0.4)."""
        return generate_latest(self.registry)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def metrics_reference() -> str:
    """The Markdown reference table of every metric, from the declarations themselves."""
    rows = [
        "| metric | type | labels | meaning | PromQL example |",
        "|---|---|---|---|---|",
    ]
    for doc in CanarydMetrics().reference:
        labels = ", ".join(f"`{label}`" for label in doc.labels) or "—"
        rows.append(
            f"| `{doc.name}` | {doc.type} | {labels} | {_cell(doc.meaning)} "
            f"| `{_cell(doc.example)}` |"
        )
    return "\n".join(rows) + "\n"
