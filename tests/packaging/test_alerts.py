"""The Prometheus alert rules: promtool accepts them and their unit tests pass, every alert
carries a severity, a summary, a description and a runbook link whose section exists in
docs/runbooks.md. promtool comes from Debian's `prometheus` package (.ci/services.sh);
without it the promtool tests skip, except under CI=true where they fail."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "grafana" / "alerts"
RULES = ALERTS / "canaryd.rules.yml"
RUNBOOKS = REPO / "docs" / "runbooks.md"


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
