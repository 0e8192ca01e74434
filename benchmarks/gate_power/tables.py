"""The table a person reads on stdout: `table` renders the result of `benchmark.run`
(healthy trips, the budget stress and its extrapolation, the faults against the
Kayenta-style judges and the oracles, the drift pins, the default schedule)."""

from __future__ import annotations

from typing import Any


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def stress_table(stress: dict[str, Any]) -> list[str]:
    lines = [
        "budget stress (the same healthy pairs and production gates at inflated budgets; "
        "trips per 30 days, breaches = trips only on checks past the tolerance):"
    ]
    lines.append(
        f"  {'model':<14}{'budget':>8}{'h':>7}{'pairs':>8}{'evals':>7}{'trips':>7}"
        f"{'breach':>8}{'/30d':>8}{'up95':>8}{'obs/B':>9}{'up95/B':>9}{'false/B':>9}"
        f"  obs<=B (all/false)"
    )
    for name, rows in stress.items():
        for key, row in rows.items():
            if not isinstance(row, dict) or "trips" not in row:
                continue
            budget = row["budget_per_30_days"]
            within = "/".join(
                "yes" if rate <= budget else "NO"
                for rate in (row["trips_per_30_days"], row["false_trips_per_30_days"])
            )
            lines.append(
                f"  {name:<14}{key:>8}{row['h']:>7.2f}{row['simulated_pairs']:>8}"
                f"{row['evaluations']:>7}{row['trips']:>7}{row['trips_beyond_tolerance']:>8}"
                f"{_fmt(row['trips_per_30_days']):>8}{_fmt(row['trips_per_30_days_upper95']):>8}"
                f"{row['observed_over_budget']:>9.3g}{row['upper95_over_budget']:>9.3g}"
                f"{row['false_over_budget']:>9.3g}  {within}"
                f"{' (saturated)' if row['saturated'] else ''}"
            )
    for name, rows in stress.items():
        extrapolation = rows.get("extrapolation")
        if not extrapolation:
            continue
        lines.append(f"  EXTRAPOLATION, not a measurement ({name}, rate proportional to budget):")
        for kind, label in (("false_trips", "false trips"), ("all_trips", "all trips")):
            x = extrapolation[kind]
            if x["from_budget"] is None:
                lines.append(f"    {label:<12} every budget saturated: nothing to extrapolate")
                continue
            expected = x["expected_per_30_days"]
            point = (
                f"obs/B {x['observed_over_budget']:.3g} x {x['to_budget']:g} = {expected:.3g}"
                if expected is not None
                else "no trip"
            )
            lines.append(
                f"    {label:<12} from budget {x['from_budget']:g}: {point}; 95 % bound "
                f"{x['expected_per_30_days_upper95']:.3g} per 30 days at budget {x['to_budget']:g}"
            )
        if beyond := extrapolation["beyond_tolerance_checks"]:
            lines.append(f"    past the tolerance in this model: {', '.join(beyond)}")
    return lines


def table(result: dict[str, Any]) -> str:
    lines = ["healthy traffic (trips of the switch):"]
    lines.append(
        f"  {'model':<14}{'pairs':>10}{'evals':>8}{'trips':>7}{'/30d':>9}{'/30d up95':>11}"
        f"  {'at 60 s: pairs':>14}{'evals':>7}{'trips':>7}"
    )
    for name, row in result["healthy"].items():
        cadence = row.get("cadence") or {}
        lines.append(
            f"  {name:<14}{row['simulated_pairs']:>10}{row['evaluations']:>8}{row['trips']:>7}"
            f"{_fmt(row['trips_per_30_days']):>9}{_fmt(row['trips_per_30_days_upper95']):>11}"
            f"  {_fmt(cadence.get('simulated_pairs')):>14}{_fmt(cadence.get('evaluations')):>7}"
            f"{_fmt(cadence.get('trips')):>7}"
        )
    if result.get("budget_stress"):
        lines.extend(stress_table(result["budget_stress"]))
    lines.append("faults (median pairs from the onset to detection):")
    lines.append(
        f"  {'fault':<26}{'canaryd':>9}{'kayenta':>9}{'(W)':>6}{'at edge':>9}{'(W)':>6}"
        f"{'oracle':>8}{'at tol.':>9}  tripped by"
    )
    for name, row in result["faults"].items():
        lines.append(
            f"  {name:<26}{_fmt(row['canaryd_pairs_median']):>9}"
            f"{_fmt(row['kayenta_pairs_median']):>9}{_fmt(row['kayenta_best_window']):>6}"
            f"{_fmt(row['kayenta_tolerant_pairs_median']):>9}"
            f"{_fmt(row['kayenta_tolerant_best_window']):>6}"
            f"{_fmt(row['optimal_pairs']):>8}{_fmt(row['optimal_within_tolerance_pairs']):>9}"
            f"  {row['tripped_by']}"
        )
    for name, row in result["faults"].items():
        if "screen_off_pairs_median" in row:
            lines.append(
                f"  {name} with the error gate's outage screen off: "
                f"{_fmt(row['screen_off_pairs_median'])} (canaryd "
                f"{_fmt(row['canaryd_pairs_median'])})"
            )
    pins = result["drift_pins"]
    lines.append(
        f"drift pins: {pins['pins']} drawn, {pins['pins_with_a_false_fail']} with a false FAIL "
        f"in 30 days; {_fmt(pins['false_fail_per_category_30d'])} per category "
        f"(95 % bound {pins['false_fail_per_category_30d_upper95']:.2g}) vs its budget share "
        f"{pins['budget_share_per_category_30d']:.2g}; before (a 30-pair pin taken as exact): "
        f"{pins['before']['pins_with_a_false_fail']} pins"
    )
    schedule = result["default_schedule"]
    hours = ", ".join(
        f"{name} {_fmt(row['hours_to_all_pass'])}"
        for name, row in schedule.items()
        if isinstance(row, dict)
    )
    lines.append(f"default schedule: hours to every enforce gate PASS: {hours}")
    config = result["config"]
    lines.append(
        f"budget {config['budget']['false_rollbacks_per_30_days']:g}/30 days, "
        f"{config['detectors']} detectors ({config.get('budget_shares', config['detectors']):g} "
        f"budget shares), ARL0 {config['detector_arl0']:.4g} pairs, "
        f"h {config['h']:.3f}; elapsed {result['elapsed_s']:.0f}s"
    )
    return "\n".join(lines)
