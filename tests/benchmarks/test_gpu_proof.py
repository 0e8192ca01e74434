"""The GPU proof as a person runs it on a CPU (`--device cpu --quick`), so that the
command a GPU machine is lent for never rots; and its per-category figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_proof_arms import per_category
from benchmarks.gpu_proof_daemon import daemon_checks
from benchmarks.heads_ablation import ArmFigures
from tests.benchmarks.test_heads_ablation import STATS, TOKENS, result

REPO = Path(__file__).resolve().parents[2]
QUICK_ON_CPU = ["benchmarks/gpu_proof.py", "--device", "cpu", "--quick"]


@pytest.mark.slow
class TestQuickRunOnTheCpu:
    def test_every_arm_is_lossless_and_the_daemon_trips_the_switch(self, tmp_path: Path) -> None:
        """The command exits 0 and its JSON has every arm lossless, the resource monitor
        saying there is no GPU, and a daemon run that stored pairs on every arm, gate
        decisions, and a gate's trip of the switch."""
        out = tmp_path / "proof.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("CANARYD_")}
        env |= {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
        run = subprocess.run(
            [sys.executable, *QUICK_ON_CPU, "--out", str(out)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
            check=False,
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        report = json.loads(out.read_text())
        assert report["ok"] is True and all(report["checks"].values())
        arms = report["tiny"]["arms"]
        assert set(arms) == {
            "autoregressive",
            "prompt-lookup",
            "causal-chain",
            "causal-tree",
            "independent-chain",
            "independent-tree",
        }
        assert all(arm["lossless"] is True for arm in arms.values())
        assert arms["causal-tree"]["acceptance_length"] > 1  # drafts were accepted
        assert report["tiny"]["resources"]["gpu_status"].startswith("no GPU")
        assert report["tiny"]["verify_cost"]["relative"]["1"] == 1.0
        daemon = report["daemon"]
        assert daemon["exit_code"] == 0
        assert daemon["rows"]["pairs"] > 0 and daemon["rows"]["gate_decisions"] > 0
        assert daemon["rows"]["generations"] == 2 * daemon["rows"]["pairs"]
        assert any(t["target"] == "rolled_back" for t in daemon["transitions"])
        assert report["embedded"] == {"skipped": "no --model-dir"}
        assert "part 1, tiny random model" in run.stdout and "checks: " in run.stdout


class TestPerCategory:
    def test_each_category_against_its_own_baseline_results(self) -> None:
        """A category's speedup and acceptance length come from its own prompts only."""
        base, heads = ArmFigures(), ArmFigures()
        base.add("qa", result(TOKENS, 2.0))
        heads.add("qa", result(TOKENS, 1.0, STATS))
        base.add("code", result(TOKENS, 1.0))
        heads.add("code", result(TOKENS, 2.0, STATS))
        figures = per_category(heads, base)
        assert figures["qa"]["speedup"] == 2.0 and figures["code"]["speedup"] == 0.5
        assert figures["qa"]["acceptance_length"] == 1 + 3 / 4
        assert figures["qa"]["draft_share"] == 0.2


class TestDaemonChecks:
    def test_a_daemon_that_never_stored_anything_fails_every_row_check(self) -> None:
        """A run that exited before its database existed passes no check."""
        checks = daemon_checks({"exit_code": 1}, "cpu")
        assert checks and not any(checks.values())
