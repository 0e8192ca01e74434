"""canaryd's Prometheus alert rules, written once: the source of the promtool-tested
grafana/alerts/canaryd.rules.yml and of the Kubernetes PrometheusRule
(deploy/kubernetes/prometheusrule.yaml, written by deploy/generate.py).

    .venv/bin/python grafana/rules.py                     # rewrite canaryd.rules.yml
    .venv/bin/python grafana/rules.py --check             # exit 1 when the file differs
    .venv/bin/python grafana/rules.py --runbook-base URL  # your own docs' runbooks.md

The rules select canaryd by the series only canaryd exports, never by a job name (the
Prometheus Operator names the job after the Service; one canaryd per model is common),
and keep every target label (job, instance, namespace, pod) so that an alert says which
canaryd. Each `runbook_url` is `<runbook base>#<alert name in lower case>`, a section of
docs/runbooks.md; the base defaults to docs/runbooks.md in the repository named by
pyproject.toml's [project.urls] (Repository, Source or Homepage), else to
PLACEHOLDER_BASE, a reserved `.invalid` name that says to regenerate with yours.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
RULES_FILE = REPO / "grafana" / "alerts" / "canaryd.rules.yml"
PLACEHOLDER_BASE = "https://canaryd.invalid/docs/runbooks.md"
URL_KEYS = ("Repository", "Source", "Homepage")
# A series every canaryd exporter serves from its start (an unlabelled gauge).
CANARYD_SERIES = "canaryd_heartbeat_timestamp_seconds"


def default_runbook_base(pyproject: Path = REPO / "pyproject.toml") -> str:
    """docs/runbooks.md on the project's public repository, else the placeholder."""
    urls = tomllib.loads(pyproject.read_text()).get("project", {}).get("urls", {})
    for key in URL_KEYS:
        url = str(urls.get(key, "")).rstrip("/")
        if url.startswith("https://github.com/") or url.startswith("https://gitlab.com/"):
            return f"{url}/blob/main/docs/runbooks.md"
    return PLACEHOLDER_BASE


def _rule(
    alert: str,
    expr: str,
    severity: str,
    summary: str,
    description: str,
    *,
    for_: str | None = None,
    labels: dict[str, str] | None = None,
    runbook: str | None = None,
) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": alert, "expr": expr}
    if for_:
        rule["for"] = for_
    rule["labels"] = {"severity": severity, **(labels or {})}
    rule["annotations"] = {
        "summary": summary,
        "description": " ".join(description.split()),
        "runbook_url": (runbook or alert).lower(),  # the anchor; the base comes later
    }
    return rule


# The rollback alert shares its name and `service` label with the alert the switch's
# Alertmanager actuator pushes, and its severity rule (critical once latched): one
# rollback is one alert group, whichever of the two reaches Alertmanager first.
ROLLED_BACK = "CanarydSpeculativeRolledBack"
_ROLLED_BACK_TEXT = (
    "speculative decoding is rolled back",
    "The rollback switch on {{ $labels.instance }} says baseline only. Production serves "
    "without speculation (slower, not wrong) until it is restored.",
)

RULES: list[dict[str, Any]] = [
    _rule(
        "CanarydDown",
        f"(up == 0 and on (job, instance) max_over_time({CANARYD_SERIES}[1d]))"
        f" or absent({CANARYD_SERIES})",
        "critical",
        "canaryd is down or not scraped",
        "Prometheus has not scraped canaryd ({{ $labels.instance }}) for 5 minutes. No gate "
        "runs while it is down, so speculative decoding is unguarded.",
        for_="5m",
    ),
    _rule(
        "CanarydNoPairs",
        "time() - canaryd_last_cycle_success_timestamp_seconds > 900",
        "warning",
        "canaryd has run no successful pair cycle for 15 minutes",
        "The last successful cycle on {{ $labels.instance }} finished "
        "{{ $value | humanizeDuration }} ago. Gates are going stale (NODATA).",
        for_="5m",
    ),
    _rule(
        "CanarydHeartbeatStale",
        "time() - canaryd_heartbeat_timestamp_seconds > 120",
        "critical",
        "canaryd's scheduler is not running jobs",
        "No heartbeat from {{ $labels.instance }} for {{ $value | humanizeDuration }}; the "
        "watchdog (systemd, or the liveness probe on /healthz) should have restarted it.",
        for_="2m",
    ),
    _rule(
        "CanarydGateFailing",
        # parity: CanarydCapabilityRegressed warns of it, and enforced it rolls back.
        'max without (state) (canaryd_gate_state{state="FAIL", gate!="parity"}) == 1',
        "critical",
        "canaryd gate {{ $labels.gate }} is failing",
        "Gate {{ $labels.gate }} on {{ $labels.instance }} has been FAIL for 10 minutes. An "
        "enforcing gate rolls speculative decoding back; a warn/dry-run gate does not.",
        for_="10m",
    ),
    _rule(
        ROLLED_BACK,
        "canaryd_switch_rolled_back == 1 unless on (job, instance) canaryd_switch_latched == 1",
        "warning",
        *_ROLLED_BACK_TEXT,
        labels={"service": "canaryd"},
    ),
    _rule(
        ROLLED_BACK,
        "canaryd_switch_rolled_back == 1 and on (job, instance) canaryd_switch_latched == 1",
        "critical",
        *_ROLLED_BACK_TEXT,
        labels={"service": "canaryd"},
    ),
    _rule(
        "CanarydSwitchLatched",
        "canaryd_switch_latched == 1",
        "warning",
        "the rollback switch is latched and needs an operator",
        "The switch on {{ $labels.instance }} has been latched for an hour; it will not "
        "return to speculative decoding on its own. Investigate, then restore.",
        for_="1h",
    ),
    _rule(
        "CanarydCategoryRolledBack",
        "canaryd_switch_category_rolled_back == 1",
        "warning",
        "speculative decoding is rolled back for category {{ $labels.category }}",
        "The switch on {{ $labels.instance }} turned speculation off for "
        "{{ $labels.category }} only; every other category keeps it. Requests of that "
        "category run on the baseline (slower, not wrong) until it is restored.",
    ),
    _rule(
        "CanarydAcceptanceDrift",
        'max without (gate) (canaryd_gate_state{gate="drift", state=~"WARN|FAIL"}) == 1',
        "warning",
        "speculative acceptance length has drifted",
        "The acceptance drift gate on {{ $labels.instance }} has been {{ $labels.state }} "
        "for 30 minutes: tokens per verify step moved away from the reference.",
        for_="30m",
    ),
    _rule(
        "CanarydActuatorFailing",
        "increase(canaryd_actuator_failures_total[15m]) > 0",
        "critical",
        "canaryd cannot apply the switch through {{ $labels.actuator }}",
        "Actuator {{ $labels.actuator }} on {{ $labels.instance }} failed "
        "{{ $value | humanize }} times in 15 minutes: the router may not see the switch.",
    ),
    _rule(
        "CanarydStoreErrors",
        "sum without (kind) (increase(canaryd_store_errors_total[15m])) > 0"
        " or max without () (canaryd_store_pending_pairs) > 0",
        "warning",
        "canaryd cannot write its history",
        "Store errors or pairs buffered in memory on {{ $labels.instance }} for 10 minutes: "
        "the database is unreachable; pairs are lost once the buffer is full.",
        for_="10m",
    ),
    _rule(
        "CanarydGateRunsFailing",
        'sum without (outcome) (increase(canaryd_gate_runs_total{outcome="failed"}[10m])) >= 3',
        "critical",
        "canaryd's gate runs are failing",
        "{{ $value | humanize }} gate runs on {{ $labels.instance }} raised in 10 minutes: "
        "nothing is judged, the switch cannot trip, and the state file's confirmed_at is "
        "ageing (a router following docs/switch.md turns speculation off).",
    ),
    _rule(
        "CanarydPairsQuarantined",
        "increase(canaryd_pairs_quarantined_total[1h]) > 0",
        "warning",
        "canaryd is quarantining pairs it cannot store",
        "{{ $value | humanize }} pairs on {{ $labels.instance }} went to the quarantine file "
        "in the last hour instead of the database: the gates do not see them.",
    ),
    _rule(
        "CanarydCapabilityRegressed",
        "canaryd_probe_regression == 1",
        "warning",
        "the speculative arm lost capability {{ $labels.capability }}",
        "The latest capability probe on {{ $labels.instance }} found the speculative arm "
        "failing {{ $labels.capability }}, which the baseline passes: requests that rely on "
        "it behave differently with speculation on.",
    ),
]


def groups(runbook_base: str) -> list[dict[str, Any]]:
    """The rule groups, each runbook anchor joined to `runbook_base`."""
    rules = []
    for rule in RULES:
        annotations = dict(rule["annotations"])
        annotations["runbook_url"] = f"{runbook_base}#{annotations['runbook_url']}"
        rules.append({**rule, "annotations": annotations})
    return [{"name": "canaryd", "rules": rules}]


def _scalar(value: str) -> str:
    text: str = yaml.safe_dump(value, width=10**6, allow_unicode=True)
    return text.removesuffix("\n").removesuffix("\n...")


def emit_groups(data: list[dict[str, Any]], indent: int = 0) -> str:
    """`groups:` as block YAML with folded descriptions; yaml.safe_load gives `data`."""
    pad = " " * indent
    lines = [f"{pad}groups:"]
    for group in data:
        lines.append(f"{pad}  - name: {_scalar(group['name'])}")
        lines.append(f"{pad}    rules:")
        for n, rule in enumerate(group["rules"]):
            if n:
                lines.append("")
            lines.append(f"{pad}      - alert: {rule['alert']}")
            lines.append(f"{pad}        expr: {_scalar(rule['expr'])}")
            if "for" in rule:
                lines.append(f"{pad}        for: {rule['for']}")
            lines.append(f"{pad}        labels:")
            lines.extend(f"{pad}          {k}: {_scalar(v)}" for k, v in rule["labels"].items())
            lines.append(f"{pad}        annotations:")
            for key, value in rule["annotations"].items():
                if key == "description":
                    lines.append(f"{pad}          {key}: >-")
                    wrapped = textwrap.wrap(value, width=max(40, 92 - indent - 12))
                    lines.extend(f"{pad}            {line}" for line in wrapped)
                else:
                    lines.append(f"{pad}          {key}: {_scalar(value)}")
    text = "\n".join(lines) + "\n"
    parsed = yaml.safe_load(text)
    if parsed != {"groups": data}:
        raise AssertionError("emitted rules do not read back as the source")
    return text


HEADER = """\
# Prometheus alert rules for canaryd, generated by grafana/rules.py (edit that, then run
# `.venv/bin/python grafana/rules.py [--runbook-base URL]`). Each alert links its section
# of docs/runbooks.md (anchor = alert name in lower case). Tested by
# canaryd.rules.test.yml (promtool test rules) in tests/packaging/test_alerts.py.
# No job name is assumed: canaryd is recognised by the series it exports.
"""


def render(runbook_base: str | None = None) -> str:
    """canaryd.rules.yml as committed."""
    return HEADER + emit_groups(groups(runbook_base or default_runbook_base()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    parser.add_argument(
        "--runbook-base",
        help="URL of runbooks.md (default: from pyproject.toml, else a placeholder)",
    )
    parser.add_argument("--out", type=Path, default=RULES_FILE, help="file to write or check")
    args = parser.parse_args(argv)
    text = render(args.runbook_base)
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"stale: {args.out} (run grafana/rules.py)", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
