"""A config regression caught against the concurrent stable, on real vLLM servers behind a
real Prometheus: the stable is the session's n-gram server (k = 5 draft tokens a step),
the canary a second n-gram server started here with one (`num_speculative_tokens = 1`,
a regression that halves the most a step can accept). Both serve the same prompts at the
same concurrency; Prometheus scrapes both (and the plain baseline) as target groups
`deployment = "stable"` and `"canary"`; canaryd's scrape job reads the canary with
`selector = 'deployment="canary"'` and its stable with `[telemetry.arms.speculative.stable]
selector = 'deployment="stable"'`, and the gate job's `telemetry.acceptance` FAILs the
canary against the stable over the same scrapes.

Three vLLM servers on 2 shared cores: the canary is started after the session pair is
up (about 60-100 s), and the load runs until the FAIL (at most `LOAD_MAX_S`). Sample sizes
are lowered as in test_vllm_telemetry (the gate's logic is tested, not production's
sample sizes). Its own make target (`make test-vllm-stable`, marker `three_servers`), not
part of `make test`: three servers on 2 cores take 5-10 minutes, and how fast the two
n-gram servers serve depends on the machine's load. It found that real engines' draft
counters move by turns (in the same 5 s interval once in 112): the stable's blocks now
stay open until both arms drafted (gates/telemetry/concurrent.py).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest

from canaryd.config import load_settings
from canaryd.daemon.telemetry import TelemetryJob
from canaryd.judging.gatejob import SwitchGates
from canaryd.metrics import CanarydMetrics
from canaryd.paths import models_dir
from canaryd.store import SqlStore
from engine.provision import require_embedded_model
from gates.core import GateDecision
from gates.telemetry.concurrent import judged_concurrently
from tests.canaryd.telemetry.prometheus import PrometheusServer
from tests.integration.test_vllm_telemetry import _load
from tests.integration.vllm_pair import (
    MODEL,
    SPECULATIVE_CONFIG,
    VLLM_PYTHON,
    Servers,
    _launch,
    _stop,
    _wait_ready,
    unavailable,
)

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.three_servers]

# 5 s: each scrape interval holds enough drafts of both arms to weigh; Prometheus scrapes
# every second (a slow /metrics under three servers' load times out at 250 ms).
SCRAPE_INTERVAL_S = 5.0
PROMETHEUS_INTERVAL = "1s"
LOAD_MAX_S = 600.0
CHECK_EVERY_S = 10.0
REGRESSED_K = 1


@pytest.fixture
def canary(tmp_path: Path, vllm_servers: Servers) -> Iterator[str]:
    """An n-gram server with one draft token a step, beside the session pair."""
    if not VLLM_PYTHON.exists():
        unavailable(f"{VLLM_PYTHON} missing: run `make vllm` (bash .ci/vllm.sh)")
    model_dir = require_embedded_model(models_dir())
    log = tmp_path / "canary.log"
    config = {**SPECULATIVE_CONFIG, "num_speculative_tokens": REGRESSED_K}
    process, url = _launch(
        model_dir, log, "--speculative-config", json.dumps(config),
        "--per-request-spec-decode-metrics", "detailed",
    )  # fmt: skip
    try:
        try:
            seconds = _wait_ready(process, url, log)
        except RuntimeError as exc:
            pytest.fail(str(exc))
        print(f"\nvLLM canary (k = {REGRESSED_K}) ready in {seconds:.0f} s", file=sys.stderr)
        yield url
    finally:
        _stop(process)


def config_text(servers: Servers, canary: str, tmp_path: Path, prometheus_url: str) -> str:
    return f"""
[arms.baseline]
kind = "openai"
base_url = "{servers.plain}"
model = "{MODEL}"
server_kind = "vllm"
[arms.speculative]
kind = "openai"
base_url = "{canary}"
model = "{MODEL}"
server_kind = "vllm"
speculative = true

[storage]
url = "sqlite:///{tmp_path / "canaryd.db"}"

[switch]
state_file = "{tmp_path / "switch.json"}"

[telemetry]
scrape_interval_s = {SCRAPE_INTERVAL_S}
timeout_s = 2.0
[telemetry.arms.baseline]
metrics_url = "{servers.plain}/metrics"
[telemetry.arms.speculative]
prometheus_url = "{prometheus_url}"
selector = 'deployment="canary"'
[telemetry.arms.speculative.stable]
selector = 'deployment="stable"'

[gates.telemetry.acceptance]
min_samples = 120
min_intervals = 4
max_relative_drop = 0.15
alarm_relative_drop = 0.3
"""


def _acceptance(settings_path: Path, store: SqlStore) -> GateDecision | None:
    gates = SwitchGates(load_settings(settings_path), store=store)
    try:
        gates.evaluate(datetime.now(UTC))
    finally:
        gates.close()
    evaluation = store.latest_evaluation()
    if evaluation is None:
        return None
    return next((d for d in evaluation.decisions if d.name == "telemetry.acceptance"), None)


class TestConcurrentStable:
    def test_fewer_draft_tokens_in_the_canary_fail_against_its_stable(
        self, vllm_servers: Servers, canary: str, tmp_path: Path
    ) -> None:
        targets = {
            "plain": [f"{vllm_servers.plain}/metrics"],
            "stable": [f"{vllm_servers.ngram}/metrics"],
            "canary": [f"{canary}/metrics"],
        }
        (tmp_path / "prometheus").mkdir()
        with PrometheusServer(
            tmp_path / "prometheus", targets, scrape_interval=PROMETHEUS_INTERVAL
        ) as prometheus:
            prometheus.wait_until("up == 1", lambda result: len(result) == len(targets))
            path = tmp_path / "canaryd.toml"
            path.write_text(config_text(vllm_servers, canary, tmp_path, prometheus.url))
            decision = self._run(path, vllm_servers.ngram, canary)
        assert decision is not None
        print(f"\ntelemetry.acceptance: {decision.state.value}: {decision.detail}", file=sys.stderr)
        assert decision.state.value == "FAIL", decision.detail
        assert judged_concurrently(decision) and decision.n_baseline > 0
        assert decision.estimate is not None and decision.threshold is not None
        assert decision.estimate < decision.threshold

    def _run(self, path: Path, stable: str, canary: str) -> GateDecision | None:
        settings = load_settings(path)
        stop = threading.Event()
        answered: dict[str, list[int]] = {"stable": [], "canary": []}
        decision: GateDecision | None = None
        with SqlStore.open(settings.storage.resolved_url(), create=True) as store:
            metrics = CanarydMetrics()
            job = TelemetryJob(
                lambda: settings,
                metrics.telemetry,
                store_metrics=metrics.store,
                store=lambda: store,
                leading=lambda: True,
            )
            job.start(None)
            job.run()  # the first reading: every interval starts here
            started = checked = time.monotonic()
            with ThreadPoolExecutor(4) as pool:
                for worker in range(2):
                    for name, url in (("stable", stable), ("canary", canary)):
                        pool.submit(_load, url, stop, worker, answered[name])
                try:
                    while time.monotonic() - started < LOAD_MAX_S:
                        time.sleep(SCRAPE_INTERVAL_S)
                        job.run()
                        if time.monotonic() - checked >= CHECK_EVERY_S:
                            checked = time.monotonic()
                            decision = _acceptance(path, store)
                            if decision is not None and decision.state.value == "FAIL":
                                break
                finally:
                    stop.set()
            job.close()
        print(
            f"\nconcurrent stable: {len(answered['stable'])} stable and "
            f"{len(answered['canary'])} canary requests in {time.monotonic() - started:.0f} s",
            file=sys.stderr,
        )
        return decision
