"""Building a report: read one run (or a window of history) from the store, compute every
figure once, and draw the tables and plots from those figures. Also the tables `canaryd
bench` prints for a stored bench run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from canaryd.config.arms import arm_pair_config, arms_key
from canaryd.report.arms import (
    arm_category_table,
    arm_figures,
    arm_gates_table,
    arm_ladder_tables,
    arm_position_table,
    arms_table,
    pairs_by_arm,
    plot_arm_acceptance,
    plot_arm_positions,
)
from canaryd.report.drift import drift_by_category
from canaryd.report.figures import (
    acceptance_figures,
    acceptance_lengths,
    arm_latency,
    bench_section,
    by_category,
    consistency_figures,
    ladder_figures,
    probe_section,
    run_arms,
)
from canaryd.report.html import Report
from canaryd.report.plots import (
    Plot,
    plot_acceptance_distributions,
    plot_drift,
    plot_gates,
    plot_ladder,
    plot_latency,
    plot_speedup_by_category,
    plots_missing,
)
from canaryd.report.reads import find_run, read_audit
from canaryd.report.recommend import recommend_draft_lengths
from canaryd.report.serving import serving_table
from canaryd.report.summary import summarise
from canaryd.report.sustained import SustainedFigures, sustained_figures, sustained_tables
from canaryd.report.tables import (
    acceptance_table,
    category_table,
    consistency_table,
    draft_length_table,
    drift_table,
    flips_table,
    gates_table,
    ladder_table,
    latency_table,
    probe_table,
    resources_table,
    speedup_table,
)
from canaryd.store import Store, StoredRun
from canaryd.store.rollup import facts_from_record
from gates.records import DEFAULT_ARM, PairRecord

_RECENT_RUNS = 50  # a history report looks this far back for the latest probe run


def build_report(
    store: Store,
    *,
    run_id: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    database: str = "",
) -> Report:
    """The report of one run (`run_id`) or of the pairs started in [since, until); flips
    and gate decisions of the same span (a run's: from its start to its end)."""
    run = find_run(store, run_id) if run_id is not None else None
    if run is not None:
        pairs = store.pairs(run_id=run.info.run_id)
        title = f"canaryd report — {run.info.kind} run {run.info.run_id}"
        meta = [
            f"started {run.info.started_at.isoformat(timespec='seconds')}, finished "
            + ("—" if run.finished_at is None else run.finished_at.isoformat(timespec="seconds")),
            f"baseline: {_identity(run.info.baseline_identity)}",
            f"speculative: {_identity(run.info.speculative_identity)}",
            f"config hash {run.info.config_hash}",
        ]
    else:
        pairs = store.pairs(since=since, until=until)
        title = "canaryd report — history"
        meta = [f"pairs started from {_iso(since)} to {_iso(until)}"]
    meta += [f"{len(pairs)} pairs", *([f"database {database}"] if database else [])]
    # The single-arm figures below are the switch's arm's; the others sit beside it.
    arms = _arms(store, run, pairs)
    by_arm = pairs_by_arm(pairs, arms)
    all_pairs, pairs = pairs, by_arm[arms[0]]
    if len(arms) > 1:
        meta.append(f"speculative arms: {', '.join(arms)} (the figures are {arms[0]}'s)")
    if run is not None:
        audit = read_audit(store, run.info.started_at, run.finished_at)
    else:
        audit = read_audit(store, since, until)
    notes = list(audit.notes)

    summary = summarise(pairs)
    acceptance = by_category(pairs, acceptance_figures)
    consistency = by_category(pairs, consistency_figures)
    latency = arm_latency(pairs)
    drift = drift_by_category(pairs, store.drift_references(_arms_of(store, run, arms[0])))
    draft_lengths = recommend_draft_lengths([facts_from_record(p) for p in pairs])
    section = bench_section(run) if run is not None else None
    ladder = ladder_figures(section, all_pairs) if section is not None else []
    compared = arm_figures(by_arm, arms[0]) if len(arms) > 1 else []
    sustained = _sustained(store, pairs, since, until) if run is None else None

    tables = [category_table(summary)]
    probe = _probe_run(store, run, since, until)
    if probe is not None:
        tables.insert(0, probe_table(probe[1], probe[0].info.run_id))
    if compared:
        tables += [arms_table(compared), arm_category_table(by_arm), arm_position_table(compared)]
    if ladder and compared:
        tables += arm_ladder_tables(ladder, arms)
    elif ladder:
        tables += [speedup_table(ladder), ladder_table(ladder)]
    tables += [
        acceptance_table(acceptance),
        draft_length_table(draft_lengths),
        consistency_table(consistency),
        latency_table(latency),
        *(sustained_tables(sustained) if sustained is not None else ()),
        drift_table(drift),
    ]
    if audit.flips:
        tables.append(flips_table(audit))
    if audit.gates:
        tables.append(gates_table(audit))
    if compared:
        tables.append(
            arm_gates_table({a: store.latest_evaluation(comparison_arm=a) for a in arms[1:]})
        )
    if section is not None:
        tables.append(resources_table(section.get("resources")))

    plots: list[Plot] = []
    missing = plots_missing()  # the tables are whole without the `report` extra
    if missing is not None:
        notes.append(missing)
    elif not pairs:
        notes.append("no pairs in this selection: nothing to plot")
    else:
        if any(s.speedup_median is not None for s in summary.values()):
            plots.append(plot_speedup_by_category(summary))
        if compared:
            plots += [plot_arm_acceptance(by_arm), plot_arm_positions(compared)]
        if ladder:
            plots.append(
                plot_ladder([level for level in ladder if level.speculative_arm == arms[0]])
            )
        lengths = {
            c: acceptance_lengths([p for p in pairs if p.prompt.category == c])
            for c in sorted({p.prompt.category for p in pairs})
        }
        if any(lengths.values()):
            plots.append(plot_acceptance_distributions(lengths))
        else:
            notes.append("the speculative arm reported no acceptance: no distribution plot")
        plots.append(plot_latency(latency))
        if drift:
            plots.append(plot_drift(drift, audit.flips))
    if audit.gates and missing is None:
        plots.append(plot_gates(audit))
    return Report(
        title=title,
        meta=tuple(meta),
        tables=tuple(tables),
        plots=tuple(plots),
        notes=tuple(notes),
        summary=summary,
        acceptance=acceptance,
        consistency=consistency,
        latency=latency,
        ladder=tuple(ladder),
        drift=drift,
        draft_lengths=draft_lengths,
        sustained=sustained,
    )


def _sustained(
    store: Store, pairs: Sequence[PairRecord], since: datetime | None, until: datetime | None
) -> SustainedFigures | None:
    """The cold and sustained figures of a history report's span (None without one)."""
    if since is None or until is None:
        return None
    runs = store.runs_by_id({p.run_id for p in pairs})
    starts = {run_id: run.info.started_at for run_id, run in runs.items()}
    return sustained_figures(pairs, starts, since, until)


def bench_markdown(run: StoredRun, pairs: Sequence[PairRecord]) -> str:
    """What `canaryd bench` prints: the report's tables for the stored bench run (with
    several speculative arms, the arms side by side, then the switch's arm's tables)."""
    section = bench_section(run)
    ladder = ladder_figures(section, pairs) if section is not None else []
    arms = run_arms(run, pairs)
    by_arm = pairs_by_arm(pairs, arms)
    main = by_arm[arms[0]]
    if len(arms) > 1:
        compared = arm_figures(by_arm, arms[0])
        tables = [
            arms_table(compared),
            arm_category_table(by_arm),
            arm_position_table(compared),
            *arm_ladder_tables(ladder, arms),
        ]
    else:
        tables = [speedup_table(ladder), ladder_table(ladder)]
    serving = serving_table(section)
    if serving is not None:
        tables.append(serving)
    tables += [
        acceptance_table(by_category(main, acceptance_figures)),
        consistency_table(by_category(main, consistency_figures)),
        resources_table(None if section is None else section.get("resources")),
    ]
    return "\n".join(table.markdown() for table in tables)


def _probe_run(
    store: Store, run: StoredRun | None, since: datetime | None, until: datetime | None
) -> tuple[StoredRun, dict[str, Any]] | None:
    """The probe run to draw: the run itself when it is one, else the latest probe run
    started in [since, until) (among the recent runs)."""
    candidates = [run] if run is not None else store.runs(limit=_RECENT_RUNS)
    for candidate in candidates:
        section = probe_section(candidate)
        started = candidate.info.started_at
        in_window = run is not None or (
            (since is None or started >= since) and (until is None or started < until)
        )
        if section is not None and in_window:
            return candidate, section
    return None


def _identity(identity: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in identity.items())


def _iso(moment: datetime | None) -> str:
    return "—" if moment is None else moment.isoformat(timespec="seconds")


def _reference_run(store: Store, run: StoredRun | None) -> StoredRun | None:
    """The run whose configuration the report reads: the run itself, else the latest."""
    if run is None:
        latest = store.runs(limit=1)
        run = latest[0] if latest else None
    return run


def _arms(store: Store, run: StoredRun | None, pairs: Sequence[PairRecord]) -> list[str]:
    """The speculative arms with pairs in the selection, the switch's arm first."""
    reference = _reference_run(store, run)
    named = run_arms(reference, pairs) if reference is not None else sorted({p.arm for p in pairs})
    present = {p.arm for p in pairs}
    return [arm for arm in named if arm in present] or [DEFAULT_ARM]


def _arms_of(store: Store, run: StoredRun | None, arm: str) -> str:
    """The arms key whose drift references the report shows for `arm`: the run's own,
    else the latest run's."""
    run = _reference_run(store, run)
    if run is None:
        return ""
    return arms_key(arm_pair_config(run.info.config.get("arms"), arm))
