"""What `canaryd status` reports: the recent state of the canary, read from the store.

`build_status(store, now)` reads once (raw pairs of the last day and the roll-ups of
hours starting in it, in one snapshot) and hands everything to pure functions:
`window_status` turns the pairs and roll-ups of a window into figures. Counts, means and
rates are exact either way (roll-ups keep sums); end-to-end quantiles are exact over raw
pairs and, as soon as a rolled-up hour contributes, read from the merged latency
histograms and flagged `approximate`. Each category's recommended draft length
(`canaryd.report.recommend`) rests on the raw pairs of the last day, which carry the acceptance
per position and the step timings a roll-up does not. Inter-token latency and the fallback
rate come from a bounded read of the window's generations (`HistoryStore.serving`): per
arm, the median over successful generations of each one's own ITL P50, P95 and P99 (as
`canaryd once` reports ITL), and the speculative arm's fallback rate pooled over verify
steps, `1 − steps that kept ≥ 1 draft token / verify steps`. Roll-ups keep neither, so
both rest on raw pairs only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from canaryd.judging.leader import Holder
from canaryd.report.recommend import DraftRecommendation, recommend_draft_lengths
from canaryd.store import Store, StoredRun
from canaryd.store.rollup import (
    LATENCY_BOUNDS_S,
    ArmRollup,
    PairFacts,
    PairRollup,
    histogram_quantile,
    merge_rollups,
    rollup_of,
)
from canaryd.store.serving import ServingFacts
from gates.records import ARMS, DEFAULT_ARM, Arm
from gates.stats.descriptive import quantile, rate

STATUS_SCHEMA = "canaryd.status/1"
WINDOWS: tuple[tuple[str, timedelta], ...] = (
    ("last_hour", timedelta(hours=1)),
    ("last_day", timedelta(days=1)),
)
RECOMMENDATION_WINDOW = timedelta(days=1)  # the raw pairs draft lengths are chosen from


@dataclass(frozen=True, slots=True)
class ArmStatus:
    """One arm over a window: successful generations, failures by kind, e2e P50/P99, and
    the median over raw generations of each one's own ITL P50/P95/P99."""

    ok: int
    errors: dict[str, int]
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    e2e_approximate: bool  # quantiles read from histograms because roll-ups contributed
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None
    itl_p99_s: float | None = None
    itl_generations: int = 0  # raw successful generations with an ITL summary

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


@dataclass(frozen=True, slots=True)
class WindowStatus:
    """The pairs started in [since, until): raw pairs plus rolled-up hours starting in it."""

    since: datetime
    until: datetime
    pairs: int
    complete_pairs: int
    pairs_by_category: dict[str, int]
    rolled_up_pairs: int  # of `pairs`, how many are known only through roll-ups
    acceptance_length_mean: float | None  # mean over complete pairs of 1 + accepted / steps
    exact_match_rate: float | None  # over scored (complete) pairs
    baseline: ArmStatus
    speculative: ArmStatus
    # 1 − verify steps that kept ≥ 1 draft token / verify steps, pooled over the raw
    # speculative generations that report acceptance per position; None without any.
    fallback_rate: float | None = None
    fallback_verify_steps: int = 0

    @property
    def approximate(self) -> bool:
        return self.rolled_up_pairs > 0

    def arm(self, arm: Arm) -> ArmStatus:
        return self.baseline if arm == "baseline" else self.speculative


@dataclass(frozen=True, slots=True)
class StatusReport:
    now: datetime
    database: str  # URL, password masked
    last_pair_at: datetime | None  # latest raw pair; else the start of the latest rolled-up hour
    latest_run: StoredRun | None
    windows: dict[str, WindowStatus]
    leader: Holder | None = None  # the daemon that runs the gates; None: none does
    draft_lengths: dict[str, DraftRecommendation] = field(default_factory=dict)
    # `windows` are the switch arm's pairs; `arm_windows` every speculative arm's (the
    # switch's included), by arm, then by window name.
    switch_arm: str = DEFAULT_ARM
    arm_windows: dict[str, dict[str, WindowStatus]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """No pair was ever recorded (or all of it is past every retention)."""
        return self.last_pair_at is None

    @property
    def last_pair_age_s(self) -> float | None:
        if self.last_pair_at is None:
            return None
        return (self.now - self.last_pair_at).total_seconds()

    def as_json(self) -> dict[str, Any]:
        """The stable `--json` object (docs/storage.md, "canaryd status")."""
        run = self.latest_run
        return {
            "schema": STATUS_SCHEMA,
            "now": self.now.isoformat(),
            "database": self.database,
            "empty": self.empty,
            "last_pair_at": _iso(self.last_pair_at),
            "last_pair_age_s": self.last_pair_age_s,
            "latest_run": None
            if run is None
            else {
                "run_id": run.info.run_id,
                "kind": run.info.kind,
                "started_at": run.info.started_at.isoformat(),
                "finished_at": _iso(run.finished_at),
                "config_hash": run.info.config_hash,
                "baseline": run.info.baseline_identity,
                "speculative": run.info.speculative_identity,
            },
            "windows": {name: _window_json(window) for name, window in self.windows.items()},
            "leader": None if self.leader is None else self.leader.as_json(),
            "draft_length": {c: r.as_json() for c, r in self.draft_lengths.items()},
            "switch_arm": self.switch_arm,
            "speculative_arms": {
                arm: {name: _window_json(window) for name, window in windows.items()}
                for arm, windows in self.arm_windows.items()
            },
        }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _window_json(window: WindowStatus) -> dict[str, Any]:
    return {
        "since": window.since.isoformat(),
        "until": window.until.isoformat(),
        "pairs": window.pairs,
        "complete_pairs": window.complete_pairs,
        "pairs_by_category": window.pairs_by_category,
        "rolled_up_pairs": window.rolled_up_pairs,
        "approximate": window.approximate,
        "acceptance_length_mean": window.acceptance_length_mean,
        "exact_match_rate": window.exact_match_rate,
        "fallback_rate": window.fallback_rate,
        "fallback_verify_steps": window.fallback_verify_steps,
        "arms": {
            arm: {
                "ok": status.ok,
                "errors": status.errors,
                "error_count": status.error_count,
                "e2e_p50_s": status.e2e_p50_s,
                "e2e_p99_s": status.e2e_p99_s,
                "e2e_approximate": status.e2e_approximate,
                "itl_p50_s": status.itl_p50_s,
                "itl_p95_s": status.itl_p95_s,
                "itl_p99_s": status.itl_p99_s,
                "itl_generations": status.itl_generations,
            }
            for arm in ARMS
            for status in (window.arm(arm),)
        },
    }


# --- pure aggregation ------------------------------------------------------------------


def _arm_status(
    arm: Arm,
    pairs: Sequence[PairFacts],
    total: ArmRollup,
    approximate: bool,
    serving: Sequence[ServingFacts],
) -> ArmStatus:
    if approximate:
        p50 = histogram_quantile(total.e2e_histogram, LATENCY_BOUNDS_S, 0.5)
        p99 = histogram_quantile(total.e2e_histogram, LATENCY_BOUNDS_S, 0.99)
    else:
        e2e = [facts.e2e_s for p in pairs if (facts := getattr(p, arm)).ok]
        p50, p99 = quantile(e2e, 0.5), quantile(e2e, 0.99)
    summarised = [f for f in serving if f.role == arm and f.ok and f.itl_p99_s is not None]

    def median_of(values: Sequence[float | None]) -> float | None:
        return quantile([v for v in values if v is not None], 0.5)

    return ArmStatus(
        ok=total.ok,
        errors=dict(sorted(total.errors.items())),
        e2e_p50_s=p50,
        e2e_p99_s=p99,
        e2e_approximate=approximate,
        itl_p50_s=median_of([f.itl_p50_s for f in summarised]),
        itl_p95_s=median_of([f.itl_p95_s for f in summarised]),
        itl_p99_s=median_of([f.itl_p99_s for f in summarised]),
        itl_generations=len(summarised),
    )


def fallback_counts(serving: Sequence[ServingFacts]) -> tuple[int, int]:
    """(verify steps, steps that kept no draft token), pooled over the successful
    speculative generations that report acceptance per position."""
    stepped = [
        f
        for f in serving
        if f.role == "speculative" and f.ok and f.kept_steps is not None and f.verify_steps
    ]
    steps = sum(f.verify_steps or 0 for f in stepped)
    return steps, steps - sum(f.kept_steps or 0 for f in stepped)


def window_status(
    since: datetime,
    until: datetime,
    pairs: Sequence[PairFacts],
    rollups: Sequence[PairRollup],
    serving: Sequence[ServingFacts] = (),
) -> WindowStatus:
    """Figures of the raw pairs started in [since, until) and the roll-ups of hours starting
    in it, with ITL and fallbacks from `serving` rows in it (others are ignored, so callers
    may pass a wider read)."""
    raw = [p for p in pairs if since <= p.started_at < until]
    served = [f for f in serving if since <= f.started_at < until]
    steps, fallbacks = fallback_counts(served)
    hours = [r for r in rollups if since <= r.hour_start < until]
    total = merge_rollups(rollup_of(raw, since, "all"), *hours, hour=since, category="all")
    by_category = Counter(p.category for p in raw)
    for rollup in hours:
        by_category[rollup.category] += rollup.pairs
    rolled_up = sum(r.pairs for r in hours)
    approximate = rolled_up > 0
    return WindowStatus(
        since=since,
        until=until,
        pairs=total.pairs,
        complete_pairs=total.complete_pairs,
        pairs_by_category=dict(sorted(by_category.items())),
        rolled_up_pairs=rolled_up,
        acceptance_length_mean=(
            total.acceptance_length_sum / total.acceptance_length_count
            if total.acceptance_length_count
            else None
        ),
        exact_match_rate=rate(total.exact_matches, total.scored_pairs),
        baseline=_arm_status("baseline", raw, total.baseline, approximate, served),
        speculative=_arm_status("speculative", raw, total.speculative, approximate, served),
        fallback_rate=rate(fallbacks, steps),
        fallback_verify_steps=steps,
    )


def status_report(
    now: datetime,
    database: str,
    pairs: Sequence[PairFacts],
    rollups: Sequence[PairRollup],
    last_pair_at: datetime | None,
    latest_run: StoredRun | None,
    serving: Sequence[ServingFacts] = (),
) -> StatusReport:
    """The report for `now` from pairs and roll-ups covering at least the longest window;
    the figures of `windows` are the latest run's switch arm's (each pair counts its
    baseline once)."""
    switch_arm = latest_run.switch_arm if latest_run is not None else DEFAULT_ARM
    seen = {p.arm for p in pairs} | {r.arm for r in rollups}
    arms = [switch_arm, *sorted(seen - {switch_arm})]
    arm_windows = {
        arm: {
            name: window_status(
                now - length,
                now,
                [p for p in pairs if p.arm == arm],
                [r for r in rollups if r.arm == arm],
                [f for f in serving if f.arm == arm],
            )
            for name, length in WINDOWS
        }
        for arm in arms
    }
    windows = arm_windows[switch_arm]
    pairs = [p for p in pairs if p.arm == switch_arm]
    day = [p for p in pairs if now - RECOMMENDATION_WINDOW <= p.started_at < now]
    return StatusReport(
        now=now,
        database=database,
        last_pair_at=last_pair_at,
        latest_run=latest_run,
        windows=windows,
        draft_lengths=recommend_draft_lengths(day),
        switch_arm=switch_arm,
        arm_windows=arm_windows,
    )


# --- reading the store -----------------------------------------------------------------


def build_status(store: Store, now: datetime, *, database: str = "") -> StatusReport:
    """Read what the report needs from `store` and build it for `now` (timezone-aware)."""
    longest = max(length for _, length in WINDOWS)
    history = store.history(now - longest, now)
    last_pair_at = store.latest_pair_started_at() or store.latest_rollup_hour()
    runs = store.runs(limit=1)
    serving = store.serving(now - longest, now)
    return status_report(
        now=now,
        database=database,
        pairs=history.pairs,
        rollups=history.rollups,
        last_pair_at=last_pair_at,
        latest_run=runs[0] if runs else None,
        serving=serving,
    )
