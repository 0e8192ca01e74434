"""On the embedded model, a deliberately poor drafter flips the rollback switch.

The speculative arm drafts with the first 2 of the model's 30 layers (early exit): its
drafts are nearly always rejected, so every verify step costs more than a plain decode
step and the arm is slower than baseline. The speedup gate's sign detector must alarm
within ten pairs on a busy machine (where an odd pair may come out faster), so the test
spends a huge false-alarm budget (a detector threshold of about 1.2) and sets the
detector's alternative to "80 % of pairs slower" — the production code with a
test-sized calibration. It must FAIL, the policy trips at once, the
state file flips to `rolled_back`, an audit row names the gate, and `canaryd switch
status` shows the reason.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from canaryd import paths
from canaryd.cli.app import app
from canaryd.config import load_settings
from canaryd.judging.gatejob import SwitchGates
from canaryd.pairs.runner import PairParams, PairRunner
from canaryd.pairs.sampler import StratifiedSampler
from canaryd.pairs.suites import load_default_suites, select
from canaryd.store import SqlStore
from engine.config import SpeculativeConfig, TransformersEngineConfig
from engine.hf import TransformersEngine
from engine.provision import require_embedded_model
from gates.records import RunInfo

pytestmark = [pytest.mark.model, pytest.mark.slow]

PAIRS = 10


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "canaryd.toml"
    path.write_text(
        f"""
[storage]
url = "sqlite:///{tmp_path / "canaryd.db"}"
[switch]
state_file = "{tmp_path / "switch.json"}"
[gates.budget]
false_rollbacks_per_30_days = 1000000.0
[gates.latency]
mode = "dry_run"   # a slower arm trips latency too; this test is about the speedup gate
[gates.speedup]
min_samples = {PAIRS}
critical = true
alarm_slower_share = 0.8
"""
    )
    return path


class TestPoorDrafterFlipsTheSwitch:
    def test_speedup_gate_trips_and_the_switch_records_why(self, config_file: Path) -> None:
        """A slower-than-baseline speculative arm rolls the switch back with an audit trail."""
        require_embedded_model(paths.models_dir())
        settings = load_settings(config_file)
        base = TransformersEngine(TransformersEngineConfig(), models_dir=paths.models_dir())
        poor = TransformersEngine(
            TransformersEngineConfig(
                speculative=SpeculativeConfig(
                    method="early_exit", early_exit_layer=2, num_draft_tokens=6
                )
            ),
            models_dir=paths.models_dir(),
        )
        base.load()
        poor.load()
        store = SqlStore.open(settings.storage.resolved_url(), create=True)
        try:
            run = RunInfo(
                run_id="poor-drafter", kind="once", started_at=datetime.now(UTC),
                config=settings.snapshot(), config_hash=settings.config_hash(),
                baseline_identity=base.identity, speculative_identity=poor.identity,
            )  # fmt: skip
            store.create_run(run)
            runner = PairRunner(
                base, poor, run_id=run.run_id, params=PairParams(max_tokens=12), seed=3
            )
            prompts = select(load_default_suites(), None)
            for prompt in StratifiedSampler(prompts, seed=3).take(PAIRS):
                store.save_pair(runner.run_pair(prompt))
            gates = SwitchGates(settings, metrics=None, store=store)
            gates.evaluate(datetime.now(UTC))
            audit = store.audit()
        finally:
            store.close()

        state = json.loads((config_file.parent / "switch.json").read_text())
        assert state["mode"] == "rolled_back"
        assert state["speculative_enabled"] is False
        assert state["actor"] == "gate:speedup"
        assert any(e.actor == "gate:speedup" and e.target == "rolled_back" for e in audit)

        shown = CliRunner().invoke(app, ["switch", "status", "--config", str(config_file)])
        assert shown.exit_code == 0, shown.output
        assert "rolled_back" in shown.stdout
        assert "speedup" in shown.stdout
