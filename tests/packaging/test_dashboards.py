"""The Grafana dashboards: the committed JSON is exactly what grafana/generate.py builds,
every PromQL expression (dashboards and alert rules) names only metrics that a live
canaryd exporter serves, and the History dashboard reads only canaryd's own tables."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from canaryd.metrics import CanarydMetrics
from canaryd.pairs.runner import PairRunner
from canaryd.store.models import Base
from engine.config import FakeEngineConfig
from engine.fake import FakeEngine
from engine.types import Message
from gates.records import Prompt

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "grafana" / "dashboards"
RULES = REPO / "grafana" / "alerts" / "canaryd.rules.yml"
METRIC = re.compile(r"\bcanaryd_[a-zA-Z0-9_]+\b")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


def generator() -> ModuleType:
    pytest.importorskip("grafana_foundation_sdk", reason="pip install -e '.[dev]'")
    spec = importlib.util.spec_from_file_location(
        "grafana_generate", REPO / "grafana" / "generate.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def targets(board: dict[str, Any]) -> list[dict[str, Any]]:
    found = [t for panel in board["panels"] for t in panel.get("targets", [])]
    return found + board.get("annotations", {}).get("list", [])


def promql_expressions() -> list[str]:
    exprs = [t["expr"] for board in dashboards().values() for t in targets(board) if "expr" in t]
    rules = yaml.safe_load(RULES.read_text())
    exprs += [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    return exprs


def exposed_names() -> set[str]:
    """Every sample name a canaryd exporter serves after a few fake pairs."""
    metrics = CanarydMetrics(categories=["qa", "code"])
    runner = PairRunner(
        FakeEngine(FakeEngineConfig()),
        FakeEngine(FakeEngineConfig(speculative=True, error_rate=0.2)),
        run_id="dashboards",
        seed=3,
    )
    for n in range(12):
        category = ("qa", "code")[n % 2]
        text = f"summarise canary report {n} for {category} in a few words please"
        prompt = Prompt(id=f"{category}-{n}", category=category,
                        messages=(Message("user", text),), max_tokens=32)  # fmt: skip
        metrics.pairs.observe_group((runner.run_pair(prompt),))
    metrics.liveness.cycle_finished(1.0, ok=True)
    metrics.liveness.heartbeat(1.0)
    metrics.switch.observe_gates([("latency", "PASS"), ("drift", "WARN"), ("speedup", "FAIL")])
    metrics.switch.set_state(
        rolled_back=True, generation=2, latched=False, categories=[("qa", True, False)]
    )
    names = set()
    for family in text_string_to_metric_families(metrics.render().decode()):
        # A labelled family observed nothing yet still has its HELP/TYPE: it is exposed.
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


class TestGenerated:
    def test_committed_json_is_regenerated_byte_for_byte(self) -> None:
        """grafana/dashboards/*.json are exactly what grafana/generate.py writes."""
        module = generator()
        assert sorted(module.DASHBOARDS) == sorted(dashboards())
        for name, build in module.DASHBOARDS.items():
            committed = (DASHBOARDS / name).read_text()
            assert module.render(build) == committed, f"{name} is stale: run grafana/generate.py"

    def test_datasources_come_from_a_variable_of_a_provisioned_type(self) -> None:
        """Every panel and target names its datasource by the `datasource` variable, whose
        plugin type is the panel's and one grafana/provisioning provisions."""
        provisioned = yaml.safe_load(
            (REPO / "grafana" / "provisioning" / "datasources" / "canaryd.yaml").read_text()
        )
        types = {ds["type"] for ds in provisioned["datasources"]}
        for name, board in dashboards().items():
            (variable,) = [v for v in variables(board) if v["type"] == "datasource"]
            assert variable["name"] == "datasource" and variable["query"] in types, name
            for panel in board["panels"]:
                for ref in [panel.get("datasource")] + [
                    t.get("datasource") for t in panel.get("targets", [])
                ]:
                    if ref is not None:
                        assert ref == {"type": variable["query"], "uid": "${datasource}"}, panel[
                            "title"
                        ]


def variables(board: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = board.get("templating", {}).get("list", [])
    return found


class TestOneInstanceAtATime:
    def test_every_selector_is_scoped_to_the_chosen_job_and_instance(self) -> None:
        """Each canaryd_* selector of the Prometheus dashboard (panels, annotations)
        carries job="$job" and instance="$instance", so that max(canaryd_switch_rolled_back)
        is one canaryd's, never a merge of several."""
        board = dashboards()["canaryd-canary.json"]
        exprs = [t["expr"] for t in targets(board) if "expr" in t]
        assert len(exprs) > 30
        selectors = [
            m for e in exprs for m in re.finditer(r"\b(canaryd_[A-Za-z0-9_]+)(\{[^}]*\})?", e)
        ]
        assert selectors
        for match in selectors:
            labels = match[2] or ""
            assert 'job="$job"' in labels and 'instance="$instance"' in labels, match[0]
        assert 'max(canaryd_switch_rolled_back{job="$job", instance="$instance"})' in exprs

    def test_job_and_instance_are_single_valued_variables(self) -> None:
        by_name = {v["name"]: v for v in variables(dashboards()["canaryd-canary.json"])}
        for name in ("job", "instance"):
            variable = by_name[name]
            assert variable["type"] == "query" and not variable["multi"], name
            assert not variable["includeAll"], name
            assert "canaryd_" in variable["query"], name
        assert 'job="$job"' in by_name["instance"]["query"]

    def test_every_expression_parses(self, tmp_path: Path) -> None:
        """promtool accepts every dashboard expression (variables filled in) as a
        recording rule: valid PromQL after the selectors were rewritten."""
        from tests.packaging.test_alerts import promtool

        substitutions = {"$__rate_interval": "1m", "$job": "canaryd", "$instance": "pod:9466"}
        rules = []
        for n, board in enumerate(dashboards().values()):
            for m, target in enumerate(targets(board)):
                if "expr" in target:
                    expr = target["expr"]
                    for key, value in substitutions.items():
                        expr = expr.replace(key, value)
                    rules.append({"record": f"dashboard:expr_{n}_{m}", "expr": expr})
        path = tmp_path / "exprs.yml"
        path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
        result = subprocess.run(
            [promtool(), "check", "rules", str(path)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr


class TestPromQL:
    def test_every_metric_is_served_by_canaryd(self) -> None:
        """Each canaryd_* name in a dashboard or alert expression is in a live /metrics
        scrape."""
        served = exposed_names()
        named = {name for expr in promql_expressions() for name in METRIC.findall(expr)}
        missing = sorted(named - served)
        assert missing == [], f"not exposed by canaryd: {missing}"
        assert named & served, "no expression matched a served metric"

    def test_the_canary_dashboard_covers_the_dimensions(self) -> None:
        """Switch, gates, speedup, acceptance, positions, latency, errors, quality."""
        text = json.dumps(dashboards()["canaryd-canary.json"])
        for name in (
            "canaryd_switch_rolled_back", "canaryd_switch_category_rolled_back",
            "canaryd_gate_state", "canaryd_speedup_ratio_bucket",
            "canaryd_speculative_verify_steps_total", "canaryd_speculative_position_drafted_total",
            "canaryd_ttft_seconds_bucket", "canaryd_tpot_seconds_bucket",
            "canaryd_e2e_seconds_bucket", "canaryd_errors_total",
            "canaryd_pairs_exact_match_total", "canaryd_task_score_delta_bucket",
        ):  # fmt: skip
            assert name in text, name
        assert "histogram_quantile(0.99" in text


class TestHistorySQL:
    def test_reads_only_canaryd_tables_and_columns(self) -> None:
        """Every table the SQL names exists in canaryd's schema (store/models.py)."""
        tables = set(Base.metadata.tables)
        board = dashboards()["canaryd-history.json"]
        sql = [t["rawSql"] for t in targets(board) if "rawSql" in t]
        assert sql
        for query in sql:
            for table in re.findall(r"\b(?:FROM|JOIN)\s+(\w+)", query):
                assert table in tables, (table, query)
            for table, column in re.findall(r"\b(\w+)\.(\w+)\b", query):
                if table in tables:
                    assert column in Base.metadata.tables[table].c, (table, column)
