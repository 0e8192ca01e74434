"""The hostile /metrics benchmark at a tiny size: a real `canaryd run` scraping a speculative
replica whose histogram has 139,000 `le` bounds stores nothing of it, says so in one log
line, counts every refusal, and its telemetry gates never PASS on it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks.hostile_metrics import GOAL_RSS_MB, run, scenarios

pytestmark = pytest.mark.slow


def test_a_139k_bound_histogram_is_refused_once_and_stores_nothing(tmp_path: Path) -> None:
    """Scrapes every 2 s for 20 s: every one refused by the bucket cap, one line logged,
    the baseline's intervals stored and the speculative arm's none."""
    (scenario,) = [s for s in scenarios(1 << 20) if s.name == "le_139k"]
    args = argparse.Namespace(seconds=20.0, scrape_s=2.0, gate_s=2.0, pythonpath=None)
    outcome = run(scenario, args, tmp_path)
    assert outcome.error == "" and outcome.exit_code == 0
    assert list(outcome.refusal_lines.values()) == [1]
    assert next(iter(outcome.refusal_lines)).endswith(" buckets")
    assert outcome.refused_total.get("speculative/buckets", 0) >= 3
    assert outcome.intervals.get("baseline", 0) >= 3 and "speculative" not in outcome.intervals
    assert outcome.largest_histograms_bytes < 64 * 1024
    assert outcome.peak_rss_mb < GOAL_RSS_MB
    assert not outcome.passed_on_hostile
