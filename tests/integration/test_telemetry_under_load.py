"""Production telemetry catches what pairs cannot, on real HTTP servers on loopback.

A speculative arm that is faster alone and slower under concurrency (`LoadedArm`,
`slowdown`): `canaryd judge` on pairs alone, which run one at a time against an arm with
no production traffic (a canary before it takes weight), PASSes it on the latency gate;
with `[telemetry]` scraping both arms' vLLM-named /metrics while production traffic keeps
eight requests in flight on each, `telemetry.latency` FAILs it. (Pairs sent into the same
load see it too — their latency gate FAILed within 3 pairs here — so the paired latency
gate runs `dry_run` under load: the verdict then waits for the telemetry gate alone.)
And errors that a gateway sees (`FaultProxy`, Istio's counters: every fifth answer a 500
in front of the speculative arm) FAIL `telemetry.errors`.

Sample sizes are lowered to what a test serves in about a minute; the gates' logic is
what is tested, not production's sample sizes (benchmarks/telemetry_power.py measures
those).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from tests.support.loaded_arm import FaultProxy, LoadedArm

pytestmark = pytest.mark.slow

TOKEN_DELAY_S = 0.02  # the baseline's pace: 20 ms a token whatever the load
SPECULATIVE_DELAY_S = 0.015  # faster alone ...
SLOWDOWN = 0.3  # ... and 0.015 × (1 + 0.3 × 7) ≈ 47 ms a token with eight in flight
IN_FLIGHT = 8

PAIR_GATES = """
[prompts]
max_tokens = 8
[gates.liveness]
mode = "{liveness_mode}"
min_samples = 5
window_pairs = 10
[gates.latency]
mode = "{latency_mode}"
min_samples = 30
metrics = ["e2e"]
quantiles = [0.5]
[gates.error]
mode = "dry_run"
[gates.quality]
mode = "dry_run"
[gates.speedup]
mode = "dry_run"
[gates.drift]
mode = "dry_run"
"""

TELEMETRY_GATES = """
[gates.telemetry.errors]
min_samples = 100
[gates.telemetry.latency]
min_samples = 100
metrics = ["itl"]
quantiles = [0.5]
[gates.telemetry.acceptance]
mode = "dry_run"
"""


def _config(
    path: Path,
    baseline: str,
    speculative: str,
    telemetry: dict[str, dict[str, str]] | None,
    latency_mode: str = "enforce",
    liveness_mode: str = "enforce",
) -> Path:
    text = (
        f'[arms.baseline]\nkind = "openai"\nbase_url = "{baseline}"\nmodel = "llama"\n'
        f'[arms.speculative]\nkind = "openai"\nbase_url = "{speculative}"\nmodel = "llama"\n'
        f'speculative = true\n[storage]\nurl = "sqlite:///{path.parent / "judge.db"}"\n'
        + PAIR_GATES.format(latency_mode=latency_mode, liveness_mode=liveness_mode)
    )
    if telemetry is not None:
        text += "[telemetry]\nscrape_interval_s = 1.0\ntimeout_s = 1.0\n"
        for arm, keys in telemetry.items():
            text += f"[telemetry.arms.{arm}]\n" + "".join(
                f'{key} = "{value}"\n' for key, value in keys.items()
            )
        text += TELEMETRY_GATES
    path.write_text(text)
    return path


def _judge(config: Path, pairs: int) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(app, ["judge", "-c", str(config), "-n", str(pairs), "--json"])
    assert result.exit_code in (0, 1, 3), result.output
    verdict: dict[str, Any] = json.loads(result.stdout)
    return result.exit_code, verdict


def _states(verdict: dict[str, Any]) -> dict[str, str]:
    return {gate["name"]: gate["state"] for gate in verdict["gates"]}


@contextmanager
def _production(*urls: str) -> Iterator[list[int]]:
    """`IN_FLIGHT` chat requests always in flight on each URL, until the block ends."""
    stop, answered = threading.Event(), [0] * len(urls)

    def load(index: int) -> None:
        with httpx.Client(base_url=urls[index], timeout=30.0) as client:
            while not stop.is_set():
                body = {"model": "llama", "max_tokens": 8, "stream": True,
                        "messages": [{"role": "user", "content": "hello"}]}  # fmt: skip
                try:
                    if client.post("/v1/chat/completions", json=body).status_code == 200:
                        answered[index] += 1
                except httpx.HTTPError:
                    continue

    with ThreadPoolExecutor(IN_FLIGHT * len(urls)) as pool:
        for index in range(len(urls)):
            for _ in range(IN_FLIGHT):
                pool.submit(load, index)
        try:
            yield answered
        finally:
            stop.set()


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
    for name in ("CANARYD_CONFIG", "CANARYD_STORAGE__URL", "CANARYD_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_an_arm_slower_only_under_concurrency_fails_telemetry_latency(env: Path) -> None:
    """Pairs alone (one at a time, no production load) PASS the arm; under production
    load the telemetry gate FAILs it on the inter-token latency both servers report."""
    with (
        LoadedArm(TOKEN_DELAY_S) as baseline,
        LoadedArm(SPECULATIVE_DELAY_S, slowdown=SLOWDOWN, speculative=True) as speculative,
    ):
        alone = _config(env / "pairs.toml", baseline.url, speculative.url, None)
        code, verdict = _judge(alone, 60)
        assert code == 0, verdict
        assert _states(verdict)["latency"] == "PASS", verdict
        assert not any(name.startswith("telemetry.") for name in _states(verdict))

        scraped = _config(
            env / "telemetry.toml",
            baseline.url,
            speculative.url,
            {
                "baseline": {"metrics_url": f"{baseline.url}/metrics"},
                "speculative": {"metrics_url": f"{speculative.url}/metrics"},
            },
            latency_mode="dry_run",
        )
        with _production(baseline.url, speculative.url) as answered:
            code, verdict = _judge(scraped, 400)
        states = _states(verdict)
        print(  # shown with -s
            f"\nunder load: {answered} production requests answered, most in flight "
            f"{baseline.most_in_flight}/{speculative.most_in_flight}; verdict "
            f"{json.dumps(verdict)[:1500]}",
            file=sys.stderr,
        )
        assert code == 1, verdict
        assert states["telemetry.latency"] == "FAIL", verdict


def test_errors_a_gateway_sees_fail_telemetry_errors(env: Path) -> None:
    """Every fifth answer in front of the speculative arm is a 500 from the proxy, which
        counts it as Istio does: `telemetry.errors` FAILs it from the gateway's counters. The
    pairs pass through the proxy too; liveness runs `dry_run`, so whether five of them in a
    row drew a 500 cannot decide the verdict first."""
    with (
        LoadedArm(TOKEN_DELAY_S) as baseline_arm,
        LoadedArm(TOKEN_DELAY_S, speculative=True) as speculative_arm,
        FaultProxy(baseline_arm.url) as baseline,
        FaultProxy(speculative_arm.url, every=5) as speculative,
    ):
        gateway = {"kind": "gateway", "gateway": "istio"}
        scraped = _config(
            env / "telemetry.toml",
            baseline.url,
            speculative.url,
            {
                "baseline": {**gateway, "metrics_url": f"{baseline.url}/metrics"},
                "speculative": {**gateway, "metrics_url": f"{speculative.url}/metrics"},
            },
            liveness_mode="dry_run",  # the pairs pass the proxy too: a run of 500s is luck
        )
        with _production(baseline.url, speculative.url) as answered:
            code, verdict = _judge(scraped, 400)
        states = _states(verdict)
        print(
            f"\nthrough the proxy: {answered} answered; {json.dumps(verdict)[:1500]}",
            file=sys.stderr,
        )
        assert code == 1, verdict
        assert states["telemetry.errors"] == "FAIL", verdict
