"""The Prometheus alert rules: the committed file is what grafana/rules.py generates,
promtool accepts it and its unit tests pass, every alert carries a severity, a summary, a
description and a runbook link whose section exists in docs/runbooks.md, and no rule
assumes a job name. promtool comes from Debian's `prometheus` package (.ci/services.sh);
without it the promtool tests skip, except under CI=true where they fail."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "grafana" / "alerts"
RULES = ALERTS / "canaryd.rules.yml"
RUNBOOKS = REPO / "docs" / "runbooks.md"


def rules_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grafana_rules", REPO / "grafana" / "rules.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def promtool() -> str:
    path = shutil.which("promtool")
    if path:
        return path
    reason = "promtool is not installed (Debian package `prometheus`; bash .ci/services.sh)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"required under CI=true: {reason}")
    pytest.skip(reason)


def alerts() -> list[dict[str, Any]]:
    data = yaml.safe_load(RULES.read_text())
    return [rule for group in data["groups"] for rule in group["rules"] if "alert" in rule]


def anchors(markdown: str) -> set[str]:
    """GitHub-style anchors of the Markdown headings."""
    found = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return found


class TestPromtool:
    def test_check_rules(self) -> None:
        """`promtool check rules` accepts the file."""
        result = subprocess.run(
            [promtool(), "check", "rules", str(RULES)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr

    def test_rule_unit_tests(self) -> None:
        """`promtool test rules` passes: each alert fires when it should, not before."""
        result = subprocess.run(
            [promtool(), "test", "rules", "canaryd.rules.test.yml"],
            cwd=ALERTS, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr


class TestRuleContent:
    def test_every_alert_is_actionable(self) -> None:
        """Severity, summary, description and a runbook link on every alert."""
        for rule in alerts():
            assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
            for key in ("summary", "description", "runbook_url"):
                assert rule["annotations"].get(key), (rule["alert"], key)

    def test_runbook_links_resolve(self) -> None:
        """Each runbook_url points at docs/runbooks.md#<alert in lower case>, a heading
        that exists there."""
        sections = anchors(RUNBOOKS.read_text())
        for rule in alerts():
            url = rule["annotations"]["runbook_url"]
            path, _, anchor = url.partition("#")
            assert path.endswith("docs/runbooks.md"), url
            assert anchor == rule["alert"].lower(), url
            assert anchor in sections, f"docs/runbooks.md has no section #{anchor}"

    def test_every_alert_has_a_unit_test(self) -> None:
        """No alert goes untested by promtool."""
        tests = (ALERTS / "canaryd.rules.test.yml").read_text()
        for rule in alerts():
            assert f"alertname: {rule['alert']}" in tests, rule["alert"]


class TestGenerated:
    def test_committed_rules_are_regenerated_byte_for_byte(self) -> None:
        """grafana/alerts/canaryd.rules.yml is exactly what grafana/rules.py writes, and
        `--check` says so (exit 0), and says otherwise for a changed file (exit 1)."""
        module = rules_module()
        assert module.render() == RULES.read_text()
        assert module.main(["--check"]) == 0

    def test_check_fails_on_a_stale_file(self, tmp_path: Path) -> None:
        module = rules_module()
        stale = tmp_path / "rules.yml"
        stale.write_text(RULES.read_text().replace("for: 5m", "for: 6m", 1))
        assert module.main(["--check", "--out", str(stale)]) == 1
        assert module.main(["--out", str(stale)]) == 0
        assert stale.read_text() == RULES.read_text()

    def test_runbook_base_from_the_project_urls_else_the_placeholder(self, tmp_path: Path) -> None:
        """The repository named in [project.urls] gives the runbook links; without one,
        the reserved placeholder; --runbook-base overrides both."""
        module = rules_module()
        pyproject = tmp_path / "pyproject.toml"
        pyproject.write_text('[project]\nname = "canaryd"\n')
        assert module.default_runbook_base(pyproject) == module.PLACEHOLDER_BASE
        pyproject.write_text(
            '[project]\nname = "canaryd"\n[project.urls]\n'
            'Repository = "https://github.com/acme/canaryd/"\n'
        )
        base = module.default_runbook_base(pyproject)
        assert base == "https://github.com/acme/canaryd/blob/main/docs/runbooks.md"
        text = module.render("https://docs.acme.test/canaryd/runbooks.md")
        urls = [r["annotations"]["runbook_url"] for g in yaml.safe_load(text)["groups"]
                for r in g["rules"]]  # fmt: skip
        assert urls and all(
            u.startswith("https://docs.acme.test/canaryd/runbooks.md#") for u in urls
        )

    def test_no_rule_names_a_job_and_rollback_is_one_alert(self) -> None:
        """Expressions select canaryd by its own series, never `job=`; the rollback alert
        carries the name and `service` label the Alertmanager actuator pushes."""
        from canaryd.switch.actuators import ALERT_NAME

        for rule in alerts():
            assert "job=" not in rule["expr"].replace(" ", ""), rule["alert"]
        names = {rule["alert"] for rule in alerts()}
        assert ALERT_NAME in names and "CanarydSwitchRolledBack" not in names
        for rule in alerts():
            if rule["alert"] == ALERT_NAME:
                assert rule["labels"]["service"] == "canaryd"
