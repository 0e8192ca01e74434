"""`canaryd bench` on the embedded model stores a run, and `canaryd report` on it writes
HTML whose embedded plots a real browser (headless Chromium) decodes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd import paths
from canaryd.cli.app import app
from canaryd.store import SqlStore
from engine.provision import require_embedded_model

pytestmark = [pytest.mark.model, pytest.mark.slow]

# Writes each image's decoded width into the DOM once the page has loaded, so that
# --dump-dom shows whether the browser could decode it (0 means a broken image).
PROBE = """<script>window.addEventListener('load', () => {
  document.body.setAttribute('data-widths',
    Array.from(document.images).map(i => i.complete ? i.naturalWidth : 0).join(','));
});</script>"""


def chromium() -> str:
    """The Chromium binary, or skip (fail under CI=true) when it is not installed."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    reason = "chromium is not installed (`apt-get install -y --no-install-recommends chromium`)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Chromium is required under CI=true: {reason}")
    pytest.skip(reason)


class TestBenchAndReportOnEmbeddedModel:
    def test_bench_report_and_browser(self, tmp_path: Path) -> None:
        """A 1,2 ladder of 4 requests completes and is stored; its report's plots decode
        in headless Chromium."""
        require_embedded_model(paths.models_dir())
        url = f"sqlite:///{tmp_path / 'canaryd.db'}"
        config = tmp_path / "canaryd.toml"
        config.write_text(f'[prompts]\nmax_tokens = 32\n[storage]\nurl = "{url}"\n')
        result = CliRunner().invoke(
            app,
            ["bench", "-c", str(config), "--concurrency", "1,2", "--requests", "4",
             "--warmup", "1", "--out", str(tmp_path / "out"), "--json"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        results = json.loads(result.stdout)
        run_id = results["run_id"]
        store = SqlStore.open(url)
        try:
            run = next(r for r in store.runs() if r.info.run_id == run_id)
            pairs = store.pairs(run_id=run_id)
        finally:
            store.close()
        assert run.info.kind == "bench" and run.finished_at is not None
        assert len(pairs) == 8
        assert all(p.complete for p in pairs), [p.baseline.error_detail for p in pairs]
        for level in results["ladder"]:
            assert level["baseline"]["aggregate_tokens_per_s"] > 0
            assert level["speculative"]["aggregate_tokens_per_s"] > 0
        # Greedy prompt lookup reproduces the baseline exactly.
        assert results["consistency"]["all"]["exact_match_rate"] == 1.0
        assert results["acceptance"]["all"]["acceptance_length_mean"] >= 1.0

        out = tmp_path / "report.html"
        result = CliRunner().invoke(
            app, ["report", "--run", run_id, "--out", str(out), "--url", url]
        )
        assert result.exit_code == 0, result.output
        page = out.read_text()
        images = len(re.findall(r'<img [^>]*src="data:image/png;base64,', page))
        assert images >= 5

        browser = chromium()
        probed = tmp_path / "probed.html"
        probed.write_text(page.replace("</body>", PROBE + "</body>"))
        profile = tmp_path / "chromium-profile"
        dom = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={profile}", "--virtual-time-budget=10000",
             "--dump-dom", probed.as_uri()],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert dom.returncode == 0, dom.stderr[-2000:]
        match = re.search(r'data-widths="([\d,]*)"', dom.stdout)
        assert match, f"the onload probe did not run: {dom.stdout[:500]}"
        widths = [int(w) for w in match.group(1).split(",") if w]
        assert len(widths) == images
        assert all(w > 100 for w in widths), widths
