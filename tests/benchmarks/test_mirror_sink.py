"""The mirror-sink benchmark in its tiny mode, behind a real nginx: it runs end to end,
and the sampling bounds hold exactly (latency and memory are reported, not judged: a
loaded test machine is no place to time them)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks.mirror_sink import PER_CATEGORY, PER_MINUTE, parse, run


@pytest.mark.slow
class TestMirrorSinkBenchmark:
    def test_tiny_run_holds_the_bounds(self) -> None:
        """Through nginx's mirror, the busiest window samples exactly
        max_prompts_per_minute and no category more than max_per_category_per_minute;
        every mirrored request reaches the sink and is counted."""
        if not (shutil.which("nginx") or Path("/usr/sbin/nginx").exists()):
            pytest.skip("nginx is not installed (bash .ci/services.sh installs it)")
        figures = run(parse(["--tiny"]))
        bounds = figures["bounds"]
        assert bounds["received"] == bounds["mirrored"]
        assert bounds["max_sampled_per_window"] == PER_MINUTE
        assert bounds["max_sampled_per_category"] == PER_CATEGORY
        assert figures["latency"]["median_ratio"] > 0
        assert len(figures["rss_kb"]) == 6
        counts = figures["counts"]
        outcomes = sum(value for name, value in counts.items() if name != "received")
        assert outcomes <= counts["received"]
