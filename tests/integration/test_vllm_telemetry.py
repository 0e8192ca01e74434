"""Production telemetry of the real vLLM pair under concurrent load: the daemon's scrape job
reads the plain server's /metrics directly (`[telemetry]`, metrics_url) and the n-gram
server's through a real Prometheus scraping both (prometheus_url, the shipped vLLM
templates with `selector = 'deployment="ngram"'`), stores an interval per arm every
scrape, the daemon's gate job judges them, and `canaryd gates --json` shows the three
telemetry gates, `telemetry.acceptance` and `telemetry.latency` decided, and
`telemetry.acceptance`'s estimate is the acceptance length vLLM's own counters give over
the same time (1 + accepted ÷ drafts, read directly before and after).

The arm's concurrent stable (`[telemetry.arms.speculative.stable]`, `selector =
'deployment="ngram-stable"'`) is the same n-gram server, scraped by Prometheus as a second
target group: the stable's source, PromQL and storage paths are real, and acceptance is
judged against it (without a stable or pairs, a judgement against the past is set aside,
gates.telemetry.mix). A stable that differs from the canary is
tests/gates/telemetry/test_concurrent's.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from canaryd.cli.app import app
from canaryd.config import Settings, load_settings
from canaryd.daemon.telemetry import TelemetryJob
from canaryd.judging.gatejob import SwitchGates
from canaryd.metrics import CanarydMetrics
from canaryd.pairs.suites import load_default_suites
from canaryd.store import SqlStore
from engine import acceptance
from tests.canaryd.telemetry.prometheus import PrometheusServer
from tests.integration.vllm_pair import MODEL, Servers

pytestmark = [pytest.mark.model, pytest.mark.slow]

SCRAPE_INTERVAL_S = 2.0
LOAD_S = 90.0  # the acceptance pin (300 drafts) and the gates' lowered sample sizes, at least
# A slower machine serves fewer requests in LOAD_S: the load then goes on, the gates judged
# every CHECK_EVERY_S, until both gates the test names are decided (or LOAD_MAX_S).
LOAD_MAX_S = 540.0
CHECK_EVERY_S = 20.0
DECIDED = ("PASS", "WARN", "FAIL")  # judged on the evidence, not waiting for more
CONCURRENCY = 3  # requests in flight on each arm: the same on both, so load is matched
MAX_TOKENS = 48
CATEGORIES = ("summarisation", "extraction", "rag", "translation")


def config_text(servers: Servers, tmp_path: Path, prometheus_url: str) -> str:
    return f"""
[arms.baseline]
kind = "openai"
base_url = "{servers.plain}"
model = "{MODEL}"
server_kind = "vllm"
[arms.speculative]
kind = "openai"
base_url = "{servers.ngram}"
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
selector = 'deployment="ngram"'
[telemetry.arms.speculative.stable]
selector = 'deployment="ngram-stable"'

[gates.telemetry.errors]
min_samples = 20
[gates.telemetry.latency]
min_samples = 20
metrics = ["itl"]
quantiles = [0.5]
[gates.telemetry.acceptance]
min_samples = 120
min_intervals = 4
pin_min_drafts = 300
pin_min_intervals = 4
max_relative_drop = 0.3
alarm_relative_drop = 0.5
"""


def _messages() -> list[list[dict[str, str]]]:
    """The categories' prompts taken in turn (one of each, then the next of each): the
    n-gram arm's acceptance differs by category (summarisation copies from its prompt,
    translation cannot), so every stretch of the load, the pinned reference's too, sees
    the same mix. The suites list a category's prompts together; in that order the pin
    saw summaries alone and the window later a drop of 12.9 %."""
    by_category: dict[str, list[list[dict[str, str]]]] = {c: [] for c in CATEGORIES}
    for suite in load_default_suites():
        for prompt in suite.prompts:
            if prompt.category in by_category:
                by_category[prompt.category].append(
                    [{"role": m.role, "content": m.content} for m in prompt.messages]
                )
    turns = itertools.zip_longest(*by_category.values())
    return [messages for turn in turns for messages in turn if messages is not None]


def _load(url: str, stop: threading.Event, worker: int, done: list[int]) -> None:
    """Chat completions one after another until `stop`; counts the answered ones."""
    messages = _messages()
    index = worker
    with httpx.Client(timeout=120.0) as client:
        while not stop.is_set():
            body = {
                "model": MODEL,
                "messages": messages[index % len(messages)],
                "max_tokens": MAX_TOKENS,
                "temperature": 0.0,
            }
            index += CONCURRENCY
            try:
                if client.post(f"{url}/v1/chat/completions", json=body).status_code == 200:
                    done.append(1)
            except httpx.HTTPError:
                continue


def _counters(url: str) -> acceptance.Counters:
    response = httpx.get(f"{url}/metrics", timeout=10.0)
    response.raise_for_status()
    return acceptance.vllm_counters(response.text)


def _decided(settings: Settings, store: SqlStore) -> bool:
    """Whether the gates judge `telemetry.acceptance` and `telemetry.latency` decided now."""
    gates = SwitchGates(settings, store=store)
    try:
        gates.evaluate(datetime.now(UTC))
    finally:
        gates.close()
    evaluation = store.latest_evaluation()
    states = {d.name: d.state.value for d in evaluation.decisions} if evaluation else {}
    judged = ("telemetry.acceptance", "telemetry.latency")
    return all(states.get(name) in DECIDED for name in judged)


@pytest.fixture
def servers(request: pytest.FixtureRequest) -> Servers:
    """The pair named by CANARYD_VLLM_URLS, else the session's (started once)."""
    named = os.environ.get("CANARYD_VLLM_URLS")
    if named:
        plain, ngram = named.split(",")
        return Servers(plain, ngram)
    pair: Servers = request.getfixturevalue("vllm_servers")
    return pair


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("CANARYD_CONFIG", raising=False)
    monkeypatch.delenv("CANARYD_STORAGE__URL", raising=False)
    yield tmp_path


class TestVllmTelemetry:
    def test_gates_judge_the_pairs_own_telemetry_under_load(
        self, servers: Servers, data_dir: Path
    ) -> None:
        """Under the same concurrent load on both arms, read every 2 s (the n-gram arm
        through Prometheus): the telemetry gates are decided, and the acceptance estimate
        matches vLLM's own counters."""
        ngram = [f"{servers.ngram}/metrics"]
        targets = {"plain": [f"{servers.plain}/metrics"], "ngram": ngram, "ngram-stable": ngram}
        (data_dir / "prometheus").mkdir()
        with PrometheusServer(data_dir / "prometheus", targets) as prometheus:
            prometheus.wait_until("up == 1", lambda result: len(result) == len(targets))
            self._judge(servers, data_dir, prometheus.url)

    def _judge(self, servers: Servers, data_dir: Path, prometheus_url: str) -> None:
        path = data_dir / "canaryd.toml"
        path.write_text(config_text(servers, data_dir, prometheus_url))
        settings = load_settings(path)
        stop = threading.Event()
        answered: dict[str, list[int]] = {"baseline": [], "speculative": []}
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
            before = _counters(servers.ngram)
            job.run()  # the first reading: every interval starts here
            started = time.monotonic()
            with ThreadPoolExecutor(2 * CONCURRENCY) as pool:
                for worker in range(CONCURRENCY):
                    for arm, url in (
                        ("baseline", servers.plain),
                        ("speculative", servers.ngram),
                    ):
                        pool.submit(_load, url, stop, worker, answered[arm])
                try:
                    checked = started
                    while time.monotonic() - started < LOAD_MAX_S:
                        time.sleep(SCRAPE_INTERVAL_S)
                        job.run()
                        after = _counters(servers.ngram)  # beside the reading just stored
                        elapsed = time.monotonic() - started
                        if elapsed >= LOAD_S and time.monotonic() - checked >= CHECK_EVERY_S:
                            checked = time.monotonic()
                            # Judged on what is stored now, while the load goes on: the
                            # decision the test asserts is this one, not a later one on
                            # evidence that has moved (acceptance varies with the prompts).
                            if _decided(settings, store):
                                break
                finally:
                    stop.set()
                    loaded_s = time.monotonic() - started
            job.close()
            intervals = {arm: store.telemetry(arm) for arm in ("baseline", "speculative")}
            evaluation = store.latest_evaluation()
        assert evaluation is not None
        stored = {d.name: d.to_dict() for d in evaluation.decisions}
        for name in ("telemetry.errors", "telemetry.latency", "telemetry.acceptance"):
            print(f"\n{name}: {json.dumps(stored.get(name), default=str)[:3000]}", file=sys.stderr)
        result = CliRunner().invoke(app, ["gates", "--json", "--config", str(path)])
        assert result.exit_code == 0, result.output
        decisions = {d["name"]: d for d in json.loads(result.stdout)["gates"]}
        drafts = after["drafts"] - before.get("drafts", 0.0)
        accepted = after["accepted_tokens"] - before.get("accepted_tokens", 0.0)
        direct = 1.0 + accepted / drafts
        accepted_gate = decisions["telemetry.acceptance"]
        latency = decisions["telemetry.latency"]
        print(  # shown with -s: the figures the issue asks for
            f"\nvLLM telemetry: {len(answered['baseline'])} baseline and "
            f"{len(answered['speculative'])} speculative requests answered in {loaded_s:.0f} s, "
            f"{len(intervals['baseline'])}/{len(intervals['speculative'])} intervals stored; "
            f"acceptance length from vLLM's counters {direct:.4f} ({accepted:.0f} accepted / "
            f"{drafts:.0f} drafts), telemetry.acceptance estimate {accepted_gate['estimate']} "
            f"({accepted_gate['state']}: {accepted_gate['detail']}); telemetry.latency "
            f"{latency['state']} ({latency['detail']}); telemetry.errors "
            f"{decisions['telemetry.errors']['state']}",
            file=sys.stderr,
        )
        assert {"telemetry.errors", "telemetry.latency", "telemetry.acceptance"} <= set(decisions)
        assert drafts > 0
        assert accepted_gate["estimate"] == pytest.approx(direct, rel=0.10)
        # Every draft counted once: the edges lag by at most one Prometheus scrape.
        assert accepted_gate["n_speculative"] == pytest.approx(drafts, rel=0.10)
        assert accepted_gate["state"] in DECIDED, accepted_gate["detail"]
        assert latency["state"] in DECIDED, latency["detail"]
