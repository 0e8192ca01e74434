"""Generate canaryd's Grafana dashboards from code (grafana-foundation-sdk).

    .venv/bin/python grafana/generate.py            # rewrite grafana/dashboards/*.json
    .venv/bin/python grafana/generate.py --check    # exit 1 when a committed file differs

Two dashboards: "Speculative decoding canary" on Prometheus (canaryd's /metrics) and
"History" on the PostgreSQL datasource that reads canaryd's own tables. The JSON is
committed; tests/packaging/test_dashboards.py regenerates it and compares byte for byte,
and checks every PromQL metric name against a live exporter. Each dashboard picks its
datasource from a `datasource` variable (any Prometheus, or PostgreSQL for History: the
provisioned ones of grafana/provisioning/ or a Kubernetes Grafana's own), and the canary
dashboard shows one canaryd at a time: every canaryd_* selector carries
`job="$job", instance="$instance"`, chosen from single-value variables.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model

OUT_DIR = Path(__file__).resolve().parent / "dashboards"
DATASOURCE = "${datasource}"
PROMETHEUS = model.DataSourceRef(type_val="prometheus", uid=DATASOURCE)
POSTGRES = model.DataSourceRef(type_val="grafana-postgresql-datasource", uid=DATASOURCE)
SCOPE = 'job="$job", instance="$instance"'
# A canaryd series: the variables list the targets that export canaryd's heartbeat.
SCOPE_SERIES = "canaryd_heartbeat_timestamp_seconds"
_SELECTOR = re.compile(r"\b(canaryd_[A-Za-z0-9_]+)(\{)?")
QUANTILES = (0.5, 0.95, 0.99)
WINDOW = "$__rate_interval"  # Grafana's rate window: at least four scrape intervals


# -- query helpers ------------------------------------------------------------------------


def scoped(expr: str) -> str:
    """`expr` with every canaryd_* selector narrowed to the chosen job and instance."""
    return _SELECTOR.sub(lambda m: f"{m[1]}{{{SCOPE}, " if m[2] else f"{m[1]}{{{SCOPE}}}", expr)


def promql(expr: str, legend: str, ref_id: str = "A") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(scoped(expr)).legend_format(legend).ref_id(ref_id)


def datasource_variable(plugin: str, label: str) -> dash.DatasourceVariable:
    return dash.DatasourceVariable("datasource").label(label).type(plugin)


def target_variables() -> list[dash.QueryVariable]:
    """`job`, then `instance` within it: one value each, no "All" (one canaryd at a time)."""
    job = (
        dash.QueryVariable("job")
        .label("job")
        .datasource(PROMETHEUS)
        .query(f"label_values({SCOPE_SERIES}, job)")
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
    )
    instance = (
        dash.QueryVariable("instance")
        .label("instance")
        .datasource(PROMETHEUS)
        .query(f'label_values({SCOPE_SERIES}{{job="$job"}}, instance)')
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
    )
    return [job, instance]


class SQLQuery(cogvariants.Dataquery):
    """A raw SQL target of Grafana's PostgreSQL datasource (the SDK ships no builder)."""

    def __init__(self, ref_id: str, sql: str, fmt: str) -> None:
        self.ref_id, self.sql, self.fmt = ref_id, sql, fmt

    def to_json(self) -> dict[str, Any]:
        return {
            "datasource": {"type": POSTGRES.type_val, "uid": POSTGRES.uid},
            "editorMode": "code",
            "format": self.fmt,
            "rawQuery": True,
            "rawSql": " ".join(self.sql.split()),
            "refId": self.ref_id,
        }


class SQL(cogbuilder.Builder[SQLQuery]):
    def __init__(self, sql: str, fmt: str = "time_series", ref_id: str = "A") -> None:
        self._query = SQLQuery(ref_id, sql, fmt)

    def build(self) -> SQLQuery:
        return self._query


def ref(index: int) -> str:
    return "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[index]


def series(
    title: str,
    description: str,
    targets: list[cogbuilder.Builder[Any]],
    unit: str = "short",
    *,
    width: int = 12,
    height: int = 8,
    datasource: model.DataSourceRef = PROMETHEUS,
    soft_min: float | None = None,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(datasource)
        .unit(unit)
        .span(width)
        .height(height)
        .fill_opacity(10)
    )
    if soft_min is not None:
        panel = panel.axis_soft_min(soft_min)
    for target in targets:
        panel = panel.with_target(target)
    return panel


def quantile_targets(metric: str, by: str = "arm") -> list[prometheus.Dataquery]:
    targets = []
    for index, q in enumerate(QUANTILES):
        expr = f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket[{WINDOW}])))"
        targets.append(promql(expr, f"{{{{{by}}}}} p{round(q * 100)}", ref(index)))
    return targets


# -- "Speculative decoding canary" (Prometheus) ---------------------------------------------

ACCEPTANCE_LENGTH = (
    "1 + sum by (arm, category) (rate(canaryd_speculative_accepted_tokens_total[{w}]))"
    " / sum by (arm, category) (rate(canaryd_speculative_verify_steps_total[{w}]))"
)


def canary_dashboard() -> dash.Dashboard:
    switch_flips = (
        dash.AnnotationQuery()
        .name("Switch flips")
        .datasource(PROMETHEUS)
        .enable(True)
        .icon_color("red")
        .expr(scoped("changes(canaryd_switch_generation[2m]) > 0"))
    )
    switch = [
        stat.Panel()
        .title("Speculative decoding")
        .description("0: enabled (auto); 1: rolled back (baseline only). The router reads it.")
        .datasource(PROMETHEUS)
        .with_target(promql("max(canaryd_switch_rolled_back)", "rolled back"))
        .mappings(
            [
                model.ValueMap(
                    options={
                        "0": model.ValueMappingResult(text="ENABLED", color="green"),
                        "1": model.ValueMappingResult(text="ROLLED BACK", color="red"),
                    }
                )
            ]
        )
        .span(6)
        .height(5),
        stat.Panel()
        .title("Latched")
        .description("1: rolled back by a gate and held until an operator restores it.")
        .datasource(PROMETHEUS)
        .with_target(promql("max(canaryd_switch_latched)", "latched"))
        .span(6)
        .height(5),
        stat.Panel()
        .title("Switch generation")
        .description("Increments on every switch transition (each is an audit row).")
        .datasource(PROMETHEUS)
        .with_target(promql("max(canaryd_switch_generation)", "generation"))
        .span(6)
        .height(5),
        stat.Panel()
        .title("Heartbeat age")
        .description("Seconds since the scheduler's last heartbeat; over 60 s the daemon is stuck.")
        .datasource(PROMETHEUS)
        .with_target(promql("time() - max(canaryd_heartbeat_timestamp_seconds)", "age"))
        .unit("s")
        .span(6)
        .height(5),
    ]
    categories = (
        statetimeline.Panel()
        .title("Speculative decoding per category")
        .description(
            "Each category's own switch: ROLLED BACK when the gates (scope = category) or an "
            "operator turned speculation off for that category only; LATCHED needs a human. "
            "Only categories ever moved on their own appear; a rolled-back top level turns "
            "every category off whatever this shows."
        )
        .datasource(PROMETHEUS)
        .with_target(
            promql(
                "max by (category) (canaryd_switch_category_rolled_back"
                " + canaryd_switch_category_latched)",
                "{{category}}",
            )
        )
        .mappings(
            [
                model.ValueMap(
                    options={
                        "0": model.ValueMappingResult(text="ENABLED", color="green"),
                        "1": model.ValueMappingResult(text="ROLLED BACK", color="orange"),
                        "2": model.ValueMappingResult(text="LATCHED", color="red"),
                    }
                )
            ]
        )
        .span(24)
        .height(6)
    )
    gates = (
        statetimeline.Panel()
        .title("Gate states")
        .description(
            "The current state of each gate over time (PASS, WARN, FAIL, INCONCLUSIVE, NODATA)."
        )
        .datasource(PROMETHEUS)
        .with_target(promql("max by (gate, state) (canaryd_gate_state == 1)", "{{gate}} {{state}}"))
        .span(24)
        .height(8)
    )

    detectors = series(
        "Detector progress (CUSUM S / h)",
        "How close each check's sequential detector is to tripping: its CUSUM statistic "
        "over the threshold it FAILs at (1 = FAIL, 0.5 = WARN). A healthy arm stays near 0; "
        "a check climbing steadily is accumulating evidence of a fault.",
        [promql("max by (check) (canaryd_gate_detector_progress)", "{{check}}")],
        "percentunit",
        width=24,
        soft_min=0,
    )

    speed = [
        series(
            "Speedup by category (median)",
            "Baseline e2e / speculative e2e of complete pairs. Below 1: speculation is slower.",
            [
                promql(
                    "histogram_quantile(0.5, sum by (arm, category, le)"
                    f" (rate(canaryd_speedup_ratio_bucket[{WINDOW}])))",
                    "{{arm}} {{category}}",
                )
            ],
            "x",
            soft_min=0,
        ),
        series(
            "Acceptance length by category vs 7-day reference band",
            "Tokens per verify step (1 … k+1), over 1 h; the band is the 7-day mean ± 2 sd "
            "of hourly values. Leaving the band is acceptance drift.",
            [
                promql(ACCEPTANCE_LENGTH.format(w="1h"), "{{arm}} {{category}}", "A"),
                promql(
                    f"avg_over_time(({ACCEPTANCE_LENGTH.format(w='1h')})[7d:1h])"
                    f" - 2 * stddev_over_time(({ACCEPTANCE_LENGTH.format(w='1h')})[7d:1h])",
                    "{{arm}} {{category}} band low",
                    "B",
                ),
                promql(
                    f"avg_over_time(({ACCEPTANCE_LENGTH.format(w='1h')})[7d:1h])"
                    f" + 2 * stddev_over_time(({ACCEPTANCE_LENGTH.format(w='1h')})[7d:1h])",
                    "{{arm}} {{category}} band high",
                    "C",
                ),
            ],
            soft_min=1,
        ),
        series(
            "Acceptance rate per draft position",
            "Share of verify steps whose drafted token at this position was accepted "
            "(engines that report positions only).",
            [
                promql(
                    "sum by (arm, position)"
                    " (rate(canaryd_speculative_position_accepted_total[1h]))"
                    " / sum by (arm, position)"
                    " (rate(canaryd_speculative_position_drafted_total[1h]))",
                    "{{arm}} position {{position}}",
                )
            ],
            "percentunit",
        ),
        series(
            "Output tokens per second by arm",
            "Output tokens over summed end-to-end time of successful generations.",
            [
                promql(
                    f"sum by (arm) (rate(canaryd_output_tokens_total[{WINDOW}]))"
                    f" / sum by (arm) (rate(canaryd_e2e_seconds_sum[{WINDOW}]))",
                    "{{arm}}",
                )
            ],
            "short",
        ),
    ]
    latency = [
        series(
            "TTFT P50/P95/P99",
            "Time to first token per arm.",
            quantile_targets("canaryd_ttft_seconds"),
            "s",
            width=8,
        ),
        series(
            "TPOT P50/P95/P99",
            "Time per output token per arm.",
            quantile_targets("canaryd_tpot_seconds"),
            "s",
            width=8,
        ),
        series(
            "End-to-end P50/P95/P99",
            "End-to-end latency per arm.",
            quantile_targets("canaryd_e2e_seconds"),
            "s",
            width=8,
        ),
        series(
            "ITL P99 per arm",
            "The 99th percentile gap between consecutive output tokens as the reader "
            "received them (0 inside a verify step's burst): the stall a streaming user "
            "feels, which TPOT (the mean gap) hides.",
            [
                promql(
                    "histogram_quantile(0.99, sum by (arm, le)"
                    f" (rate(canaryd_itl_seconds_bucket[{WINDOW}])))",
                    "{{arm}} p99",
                )
            ],
            "s",
            width=12,
        ),
        series(
            "Fallback rate per arm",
            "Share of verify steps that kept none of their draft (one token from the "
            "target), engines that report acceptance per position.",
            [
                promql(
                    "sum by (arm) (rate(canaryd_speculative_fallback_steps_total"
                    f'{{outcome="fallback"}}[{WINDOW}])) / sum by (arm)'
                    f" (rate(canaryd_speculative_fallback_steps_total[{WINDOW}]))",
                    "{{arm}}",
                )
            ],
            "percentunit",
            width=12,
        ),
    ]
    errors = [
        series(
            "Error rate by arm",
            "Failed generations over pairs run (each pair runs each arm once).",
            [
                promql(
                    f"sum by (arm) (rate(canaryd_errors_total[{WINDOW}]))"
                    f" / scalar(sum(rate(canaryd_pairs_total[{WINDOW}])))",
                    "{{arm}}",
                )
            ],
            "percentunit",
            width=8,
        ),
        series(
            "Errors by kind",
            "timeout, http, connection, oom, invalid, internal.",
            [
                promql(
                    f"sum by (arm, kind) (rate(canaryd_errors_total[{WINDOW}])) > 0",
                    "{{arm}} {{kind}}",
                )
            ],
            "reqps",
            width=8,
        ),
        series(
            "Store and actuators",
            "Store errors and pairs buffered in memory; actuator failures (switch file, "
            "command, webhook).",
            [
                promql(
                    "sum by (kind) (increase(canaryd_store_errors_total[15m]))",
                    "store {{kind}}",
                    "A",
                ),
                promql("max(canaryd_store_pending_pairs)", "pending pairs", "B"),
                promql(
                    "sum by (actuator) (increase(canaryd_actuator_failures_total[15m]))",
                    "actuator {{actuator}}",
                    "C",
                ),
            ],
            width=8,
        ),
    ]
    quality = [
        series(
            "Exact-match rate by category",
            "Complete pairs whose outputs were token-for-token identical (greedy: expect 1).",
            [
                promql(
                    "sum by (arm, category) (rate(canaryd_pairs_exact_match_total[1h]))"
                    " / sum by (arm, category) (rate(canaryd_pairs_compared_total[1h]))",
                    "{{arm}} {{category}}",
                )
            ],
            "percentunit",
        ),
        series(
            "Greedy divergences: numeric ties vs real",
            "Greedy pairs whose outputs differ, per hour, by the baseline model's judgement "
            "of the first divergent token: tie (bf16 numerics, not counted by the quality "
            "gate), real, unjudged (no teacher score; counted).",
            [
                promql(
                    "sum by (arm, judgement) (increase(canaryd_greedy_divergences_total[1h]))",
                    "{{arm}} {{judgement}}",
                )
            ],
        ),
        series(
            "Quality delta (speculative − baseline task score)",
            "P10 and median per category; below 0 the speculative arm scores worse.",
            [
                promql(
                    "histogram_quantile(0.1, sum by (arm, category, le)"
                    " (rate(canaryd_task_score_delta_bucket[6h])))",
                    "{{arm}} {{category}} p10",
                    "A",
                ),
                promql(
                    "histogram_quantile(0.5, sum by (arm, category, le)"
                    " (rate(canaryd_task_score_delta_bucket[6h])))",
                    "{{arm}} {{category}} p50",
                    "B",
                ),
            ],
        ),
        series(
            "Pairs per minute by outcome",
            "complete, baseline_error, speculative_error, both_error.",
            [
                promql(
                    f"sum by (outcome) (rate(canaryd_pairs_total[{WINDOW}])) * 60",
                    "{{outcome}}",
                )
            ],
        ),
        series(
            "Gate evaluations and switch transitions",
            "Gate evaluations per state, and switch transitions by target and actor.",
            [
                promql(
                    "sum by (gate, state) (increase(canaryd_gate_evaluations_total[1h]))",
                    "{{gate}} {{state}}",
                    "A",
                ),
                promql(
                    "sum by (target, actor_kind) (increase(canaryd_switch_transitions_total[1h]))",
                    "switch → {{target}} by {{actor_kind}}",
                    "B",
                ),
            ],
        ),
    ]

    parity = [
        statetimeline.Panel()
        .title("Capability parity (latest probe)")
        .description(
            "Each capability of the hourly probe (canaryd probe) on each arm: PASS, FAIL or "
            "UNSUPPORTED. A capability the baseline passes and the speculative arm does not "
            "is a regression (CanarydCapabilityRegressed)."
        )
        .datasource(PROMETHEUS)
        .with_target(
            promql(
                'max by (capability, arm) (2 * canaryd_probe_capability_state{state="pass"}'
                ' + ignoring(state) canaryd_probe_capability_state{state="unsupported"})',
                "{{capability}} {{arm}}",
            )
        )
        .mappings(
            [
                model.ValueMap(
                    options={
                        "0": model.ValueMappingResult(text="FAIL", color="red"),
                        "1": model.ValueMappingResult(text="UNSUPPORTED", color="orange"),
                        "2": model.ValueMappingResult(text="PASS", color="green"),
                    }
                )
            ]
        )
        .span(16)
        .height(10),
        series(
            "Capability regressions and probes",
            "Capabilities the speculative arm regressed on in the latest probe, and probes "
            "per 6 h by outcome (parity, regression, failed: an arm away).",
            [
                promql("sum(canaryd_probe_regression)", "regressions", "A"),
                promql(
                    "sum by (outcome) (increase(canaryd_probe_runs_total[6h]))",
                    "probes {{outcome}}",
                    "B",
                ),
            ],
            width=8,
            height=10,
            soft_min=0,
        ),
    ]

    traffic = [
        series(
            "Mirrored requests by outcome",
            "What the mirror sink did with the requests a gateway mirrored (per second): "
            "sampled for a live pair, or counted and dropped (rate_limited, duplicate, "
            "too_long, categories, queue_full, unauthorized, too_large, unusable); and the "
            "sampled requests waiting for a pair.",
            [
                promql(
                    "sum by (outcome) (rate(canaryd_traffic_requests_total[5m]))",
                    "{{outcome}}",
                    "A",
                ),
                promql("canaryd_traffic_queue_depth", "queued", "B"),
            ],
            width=6,
            soft_min=0,
        ),
        series(
            "Live traffic mix: categories",
            "Each category's share of the mirrored requests of the last closed minute: a "
            "live acceptance drop with the suites steady and this mix moved is a traffic "
            "change, not the engine's (docs/live-traffic.md).",
            [promql("canaryd_traffic_category_ratio", "{{category}}")],
            "percentunit",
            width=6,
            soft_min=0,
        ),
        series(
            "Live prompt length",
            "Mean prompt length (characters) of the live requests sampled in the last "
            "minute that sampled any.",
            [promql("canaryd_traffic_prompt_length_characters", "prompt characters")],
            width=6,
            soft_min=0,
        ),
        series(
            "Live prompt repetition",
            "Mean share of repeated word 3-grams in the sampled live prompts: the reuse "
            "prompt lookup drafts from; a fall lowers acceptance without any engine change.",
            [promql("canaryd_traffic_ngram_repetition", "repeated 3-grams")],
            "percentunit",
            width=6,
            soft_min=0,
        ),
    ]

    board = (
        dash.Dashboard("Speculative decoding canary")
        .uid("canaryd-canary")
        .description("canaryd: baseline vs speculative arm, gates and the rollback switch.")
        .tags(["canaryd", "speculative-decoding"])
        .editable()
        .timezone("utc")
        .time("now-24h", "now")
        .refresh("1m")
        .with_variable(datasource_variable("prometheus", "Prometheus"))
        .with_variable(target_variables()[0])
        .with_variable(target_variables()[1])
        .annotation(switch_flips)
        .link(
            dash.DashboardLink("History")
            .type(model.DashboardLinkType.DASHBOARDS)
            .tags(["canaryd"])
            .as_dropdown(False)
            .keep_time(True)
        )
    )
    rows: list[tuple[str, list[Any]]] = [
        ("Switch and gates", [*switch, categories, gates, detectors]),
        ("Speed and acceptance", speed),
        ("Latency", latency),
        ("Errors and store", errors),
        ("Consistency and quality", quality),
        ("Capability parity", parity),
        ("Live traffic", traffic),
    ]
    for title, panels in rows:
        board = board.with_row(dash.Row(title))
        for panel in panels:
            board = board.with_panel(panel)
    return board


# -- "History" (PostgreSQL, canaryd's tables) -------------------------------------------------

RAW_SPEEDUP = """
SELECT $__timeGroupAlias(p.started_at, '1h'), p.arm || ' ' || p.category AS metric,
  percentile_cont(0.5) WITHIN GROUP (ORDER BY b.e2e_s / NULLIF(s.e2e_s, 0)) AS value
FROM pairs p
JOIN generations b ON b.pair_id = p.pair_id AND b.arm = 'baseline'
JOIN generations s ON s.pair_id = p.pair_id AND s.arm = 'speculative'
WHERE $__timeFilter(p.started_at) AND p.complete
GROUP BY 1, 2 ORDER BY 1, 2
"""
RAW_EXACT_MATCH = """
SELECT $__timeGroupAlias(p.started_at, '1h'), p.arm || ' ' || p.category AS metric,
  avg(CASE WHEN ps.exact_match THEN 1.0 ELSE 0.0 END) AS value
FROM pairs p JOIN pair_scores ps ON ps.pair_id = p.pair_id
WHERE $__timeFilter(p.started_at)
GROUP BY 1, 2 ORDER BY 1, 2
"""
RAW_ERRORS = """
SELECT $__timeGroupAlias(p.started_at, '1h'),
  CASE WHEN g.arm = 'baseline' THEN 'baseline' ELSE p.arm END AS metric,
  avg(CASE WHEN g.error <> 'none' THEN 1.0 ELSE 0.0 END) AS value
FROM pairs p JOIN generations g ON g.pair_id = p.pair_id
WHERE $__timeFilter(p.started_at)
GROUP BY 1, 2 ORDER BY 1, 2
"""
ROLLUP_SPEEDUP = """
SELECT $__timeGroupAlias(hour_start, '1d'), arm || ' ' || category AS metric,
  sum(speedup_sum) / NULLIF(sum(speedup_count), 0) AS value
FROM pair_rollups WHERE $__timeFilter(hour_start)
GROUP BY 1, 2 ORDER BY 1, 2
"""
ROLLUP_ACCEPTANCE = """
SELECT $__timeGroupAlias(hour_start, '1d'), arm || ' ' || category AS metric,
  1 + sum(accepted_tokens)::float / NULLIF(sum(verify_steps), 0) AS value
FROM pair_rollups WHERE $__timeFilter(hour_start)
GROUP BY 1, 2 ORDER BY 1, 2
"""
ROLLUP_EXACT_MATCH = """
SELECT $__timeGroupAlias(hour_start, '1d'), arm || ' ' || category AS metric,
  sum(exact_matches)::float / NULLIF(sum(scored_pairs), 0) AS value
FROM pair_rollups WHERE $__timeFilter(hour_start)
GROUP BY 1, 2 ORDER BY 1, 2
"""
ROLLUP_QUALITY = """
SELECT $__timeGroupAlias(hour_start, '1d'), arm || ' ' || category AS metric,
  sum(quality_delta_sum) / NULLIF(sum(quality_delta_count), 0) AS value
FROM pair_rollups WHERE $__timeFilter(hour_start)
GROUP BY 1, 2 ORDER BY 1, 2
"""
ROLLUP_PAIRS = """
SELECT $__timeGroupAlias(hour_start, '1d'), arm || ' ' || category AS metric,
  sum(pairs) AS value
FROM pair_rollups WHERE $__timeFilter(hour_start)
GROUP BY 1, 2 ORDER BY 1, 2
"""
RUNS = """
SELECT run_id, kind, started_at, finished_at, config_hash,
  baseline_identity::text AS baseline, speculative_identity::text AS speculative
FROM runs WHERE $__timeFilter(started_at) ORDER BY started_at DESC LIMIT 100
"""


def history_dashboard() -> dash.Dashboard:
    def sql_series(title: str, description: str, sql: str, unit: str = "short") -> Any:
        return series(title, description, [SQL(sql)], unit, datasource=POSTGRES)

    recent = [
        sql_series(
            "Median speedup by category (raw pairs, hourly)",
            "From `pairs` and `generations`; raw rows are kept storage.raw_retention_days.",
            RAW_SPEEDUP,
            "x",
        ),
        sql_series(
            "Exact-match rate by category (raw pairs, hourly)",
            "From `pair_scores`.",
            RAW_EXACT_MATCH,
            "percentunit",
        ),
        sql_series(
            "Error rate by arm (raw pairs, hourly)",
            "Generations whose error is not 'none'.",
            RAW_ERRORS,
            "percentunit",
        ),
        table.Panel()
        .title("Runs")
        .description("Daemon lifetimes and `canaryd once` runs with their configuration hash.")
        .datasource(POSTGRES)
        .with_target(SQL(RUNS, "table"))
        .span(12)
        .height(8),
    ]
    long_term = [
        sql_series(
            "Mean speedup by category (roll-ups, daily)",
            "From `pair_rollups` (one row per category and UTC hour, kept "
            "storage.rollup_retention_days).",
            ROLLUP_SPEEDUP,
            "x",
        ),
        sql_series(
            "Acceptance length by category (roll-ups, daily)",
            "1 + accepted tokens / verify steps.",
            ROLLUP_ACCEPTANCE,
        ),
        sql_series(
            "Exact-match rate by category (roll-ups, daily)",
            "exact_matches / scored_pairs.",
            ROLLUP_EXACT_MATCH,
            "percentunit",
        ),
        sql_series(
            "Mean quality delta by category (roll-ups, daily)",
            "Speculative minus baseline task score.",
            ROLLUP_QUALITY,
        ),
        sql_series(
            "Pairs per day by category (roll-ups)", "Volume behind each figure.", ROLLUP_PAIRS
        ),
    ]
    board = (
        dash.Dashboard("History")
        .uid("canaryd-history")
        .description("canaryd's SQL history (PostgreSQL): recent raw pairs and long-term roll-ups.")
        .tags(["canaryd", "speculative-decoding"])
        .editable()
        .timezone("utc")
        .time("now-30d", "now")
        .with_variable(datasource_variable(POSTGRES.type_val or "", "PostgreSQL"))
        .link(
            dash.DashboardLink("Canary")
            .type(model.DashboardLinkType.DASHBOARDS)
            .tags(["canaryd"])
            .as_dropdown(False)
            .keep_time(True)
        )
    )
    for title, panels in (("Recent (raw pairs)", recent), ("Long term (roll-ups)", long_term)):
        board = board.with_row(dash.Row(title))
        for panel in panels:
            board = board.with_panel(panel)
    return board


DASHBOARDS: dict[str, Callable[[], dash.Dashboard]] = {
    "canaryd-canary.json": canary_dashboard,
    "canaryd-history.json": history_dashboard,
}


def render(build: Callable[[], dash.Dashboard]) -> str:
    """The dashboard as committed: sorted keys, two-space indent, a final newline."""
    return json.dumps(build().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    stale = []
    OUT_DIR.mkdir(exist_ok=True)
    for name, build in DASHBOARDS.items():
        path = OUT_DIR / name
        text = render(build)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale dashboards (run grafana/generate.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
