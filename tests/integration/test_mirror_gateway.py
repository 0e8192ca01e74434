"""Live traffic through a real gateway: a real nginx (Debian's package) in front of the
real llama.cpp server — production — on two ports side by side, one plain and one with
`mirror` to the mirror sink of an in-process canaryd daemon. Two made-up populations are
sent through nginx, code questions and then free-form chat, each request alternately to
the plain port and the mirroring one.

Production is the real llama.cpp behind the real nginx. The canary's arms are fake
engines (`kind = "fake"`, timings reported, not slept): llama.cpp reports no acceptance,
so drift could not be judged on it, and the fake arms accept per category — 0.8 per
drafted token on the suites and on code, 0.2 on chat — so the drift evidence is
deterministic. The daemon's pair cycles and gate runs are driven directly (no
scheduler), and the sink's sampling minute is ended with `flush()`.

The fake arms accept by category alone, so a category's acceptance cannot move within
it: the chat category, new to the live traffic, is held to the reference the code
category was pinned at — what live traffic accepted before the switch — as a reference
an operator configures for it would. Without the llama.cpp venv or nginx these tests
skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from canaryd.config import load_settings
from canaryd.config.arms import arm_pair_config, arms_key
from canaryd.daemon import Daemon
from canaryd.judging.gatejob import SwitchGates
from canaryd.scoring import load_metrics
from canaryd.store import SqlStore
from canaryd.traffic.requests import prompt_hash
from engine.types import Message
from gates import Evaluation, GateDecision, GateState
from gates.pairs.drift_fallback import FALLBACK_SUFFIX, fallback_key
from tests.integration.test_llamacpp_server import (
    GGUF_NAME,
    _gguf,
    _start,
    _unavailable,
    llamacpp_python,
)
from tests.support.nginx import Nginx, free_port

pytestmark = [pytest.mark.model, pytest.mark.slow]

__all__ = ["llamacpp_python"]  # the venv fixture, shared with the llama.cpp tests

KEY = "mirror-gateway-hash-key-0123456789"
HEADER = "X-Canaryd-Category"
MAX_TOKENS = 8
SUITES = ("qa", "summarisation")
PAIRS_PER_CYCLE = 40  # a population's live pairs, the rest suite pairs (the control)
RELEVANT_DROP = 0.15  # gates.drift.max_relative_drop
LATENCY_RATIO_BOUND = 1.5  # generous: the figure is printed, the bound must not flake

# Each prompt starts with a letter no other one starts with: two prompts share only the
# chat template's prefix in llama.cpp's prompt cache, so a prompt is evaluated the same
# way on both ports and its greedy answer is the same to the bit.
CODE = (
    "Write a Python function that reverses a string.",
    "Explain what a Python decorator does.",
    "Fix this code: for i in range(10) print(i)",
    "How do I read a file line by line in Python?",
    "Convert this loop to a list comprehension: for x in xs: out.append(x * 2)",
    "Implement binary search over a sorted Python list.",
    "Debug: my Python dict raises KeyError on a missing key.",
    "Sort a list of tuples by their second element in Python.",
    "Parse a JSON string into a dict in Python.",
    "Give a regular expression that matches a hex colour like #a0b1c2.",
    "Name the average time complexity of quicksort.",
    "Lambda or def: which should a short Python callback use?",
)
CHAT = (
    "Tell me about autumn and why people love long walks in the park when leaves fall.",
    "Any ideas for a relaxing weekend at the seaside with friends, good food and music?",
    "Brainstorm a name for my new puppy, a small brown dog who loves to run in circles.",
    "Make up a city on the moon and tell me what a day in the life there feels like.",
    "Recommend a book for a long train journey through the mountains in deep winter.",
    "Offer some kind words to a friend who is nervous before her first job interview.",
    "Kindly share a short poem about rain falling softly on a quiet village at night.",
    "Just curious: what makes a dinner party with old friends feel warm and welcoming?",
    "Visualise a garden in spring and describe its colours, its sounds and its smells.",
    "Quickly tell me a joke about a cat, a cucumber and a very surprised grandmother.",
    "Your thoughts on learning to paint as an adult, after years of only drawing?",
    "Ugh, Mondays. Cheer me up with a happy story about a lonely lighthouse keeper.",
)
WARM_UP = "Zebras: black with white stripes, or white with black ones?"


def _require_nginx() -> None:
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        _unavailable("nginx is not installed (bash .ci/services.sh installs Debian's package)")


def _nginx_block(production: str, sink: str, mirror_port: int) -> str:
    """Two servers on one nginx: `{port}` proxies to production, `mirror_port` proxies
    the same way and mirrors every request to canaryd's sink (docs/live-traffic.md)."""
    proxy = (
        "        proxy_pass http://production;\n"
        "        proxy_http_version 1.1;\n"
        '        proxy_set_header Connection "";\n'
        "        proxy_read_timeout 60s;\n"
    )
    return (
        f"upstream production {{ server {production}; keepalive 8; }}\n"
        f"upstream canaryd_sink {{ server {sink}; keepalive 8; }}\n"
        "server {\n"
        "    listen 127.0.0.1:{port};\n"
        f"    location /v1/ {{\n{proxy}    }}\n"
        "}\n"
        "server {\n"
        f"    listen 127.0.0.1:{mirror_port};\n"
        "    location /v1/ {\n"
        "        mirror /_canaryd_mirror;\n"
        "        mirror_request_body on;\n"
        f"{proxy}"
        "    }\n"
        "    location = /_canaryd_mirror {\n"
        "        internal;\n"
        "        proxy_pass http://canaryd_sink$request_uri;\n"
        "        proxy_http_version 1.1;\n"
        '        proxy_set_header Connection "";\n'
        "        proxy_connect_timeout 200ms;\n"
        "        proxy_read_timeout 1s;\n"
        "    }\n"
        "}\n"
    )


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "canaryd.toml"
    path.write_text(
        f"""
[arms.baseline]
kind = "fake"
[arms.speculative]
kind = "fake"
speculative = true
acceptance_rate = 0.8
acceptance_rate_by_category = {{ live_chat = 0.2 }}
[prompts]
categories = {list(SUITES)!r}
max_tokens = 16
[gates.budget]
over_design_rate = "rebudget"
[schedule]
pairs_per_cycle = {PAIRS_PER_CYCLE}
[storage]
url = "sqlite:///{tmp_path / "canaryd.db"}"
[server]
listen = "127.0.0.1:0"
[switch]
state_file = "{tmp_path / "switch.json"}"
[traffic]
listen = "127.0.0.1:0"
categories = ["live_code", "live_chat"]
live_share = 0.5
max_prompts_per_minute = 100
max_per_category_per_minute = 100
max_tokens = {MAX_TOKENS}
[gates.drift]
min_samples = 8
pin_min_samples = 10
pin_target_samples = 10
[gates.latency]
mode = "warn"  # the fake arms' timings are synthetic; this test is about drift
[gates.speedup]
mode = "warn"
""",
        encoding="utf-8",
    )
    return path


@dataclass
class Soak:
    """What the scenario measured, for the tests to judge."""

    latency_s: dict[bool, list[float]] = field(default_factory=lambda: {True: [], False: []})
    answers: dict[bool, dict[str, dict[str, Any]]] = field(
        default_factory=lambda: {True: {}, False: {}}
    )
    database_url: str = ""
    database_dir: Path = Path()
    evaluations: list[Evaluation] = field(default_factory=list)
    sampled: int = 0

    def median_ratio(self) -> float:
        return statistics.median(self.latency_s[True]) / statistics.median(self.latency_s[False])

    def rows(self, query: str, **params: Any) -> list[Any]:
        engine = create_engine(self.database_url)
        try:
            with engine.connect() as connection:
                return list(connection.execute(text(query), params))
        finally:
            engine.dispose()


def _ask(
    client: httpx.Client, prompt: str, category: str, soak: Soak | None, *, mirrored: bool
) -> None:
    body = {
        "model": GGUF_NAME,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0.0,
        "max_tokens": MAX_TOKENS,
    }
    started = time.perf_counter()
    answer = client.post("/v1/chat/completions", json=body, headers={HEADER: category})
    took = time.perf_counter() - started
    assert answer.status_code == 200, answer.text
    if soak is not None:
        soak.latency_s[mirrored].append(took)
        data = answer.json()
        soak.answers[mirrored][prompt] = {
            "choices": [
                {k: c.get(k) for k in ("message", "finish_reason")} for c in data["choices"]
            ],
            "usage": data.get("usage"),
        }


def _population(
    clients: dict[bool, httpx.Client], prompts: tuple[str, ...], category: str, soak: Soak
) -> None:
    """Each two prompts a, b as: on(a), off(b), off(a), on(b) — mirror on and off
    interleaved, in both orders, and never one prompt twice in a row."""
    for a, b in zip(prompts[::2], prompts[1::2], strict=True):
        for prompt, mirrored in ((a, True), (b, False), (a, False), (b, True)):
            _ask(clients[mirrored], prompt, category, soak, mirrored=mirrored)


def _received(daemon: Daemon, expected: int) -> None:
    """Wait until the sink has every mirrored request (nginx mirrors beside the answer),
    then end the sampling minute: the sample goes to the live queue."""
    sampler = daemon.traffic
    assert sampler is not None
    deadline = time.monotonic() + 10.0
    while sampler.counts.get("received", 0) < expected:
        assert time.monotonic() < deadline, f"the sink received {sampler.counts}"
        time.sleep(0.02)
    sampler.flush()


@pytest.fixture(scope="module")
def production(llamacpp_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real llama.cpp server, started and answering its first (slow) request while
    this process imports the daemon's scoring modules (seconds each)."""
    _require_nginx()
    log = tmp_path_factory.mktemp("llamacpp") / "production.log"
    # One thread: on a loaded 2-core machine two of them wait on each other whenever the
    # test process (client, sink, daemon) takes a core.
    server = _start(llamacpp_python, _gguf(), log, "--n_threads", "1")
    scoring = threading.Thread(target=load_metrics, name="load-scoring")
    scoring.start()
    try:
        url = next(server)
        with httpx.Client(base_url=url, timeout=60.0) as client:
            _ask(client, WARM_UP, "warm_up", None, mirrored=False)
        scoring.join()
        yield url
    finally:
        scoring.join()
        server.close()


@pytest.fixture(scope="module")
def soak(production: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Soak]:
    """The scenario, run once: the code population, a gate run that pins the references,
    the chat population, a gate run that judges."""
    tmp_path = tmp_path_factory.mktemp("mirror-gateway")
    result = Soak(database_dir=tmp_path)
    with pytest.MonkeyPatch.context() as env, contextlib.ExitStack() as stack:
        env.setenv("CANARYD_DATA_DIR", str(tmp_path / "data"))
        env.setenv("CANARYD_TRAFFIC__HASH_KEY", KEY)
        for name in ("CANARYD_CONFIG", "CANARYD_STORAGE__URL", "CANARYD_SERVER__LISTEN"):
            env.delenv(name, raising=False)
        path = _config(tmp_path)
        settings = load_settings(path)
        result.database_url = settings.storage.resolved_url()
        gates = SwitchGates(settings)
        stack.callback(gates.close)
        daemon = Daemon(settings, config_path=path, gates=gates)
        daemon.start(schedule=False)
        stack.callback(daemon.stop)
        mirror_port = free_port()
        block = _nginx_block(
            production.removeprefix("http://"), daemon.traffic_address, mirror_port
        )
        nginx = Nginx.start(tmp_path / "nginx", block)
        stack.callback(nginx.stop)
        clients = {
            False: stack.enter_context(httpx.Client(base_url=nginx.url, timeout=60.0)),
            True: stack.enter_context(
                httpx.Client(base_url=f"http://127.0.0.1:{mirror_port}", timeout=60.0)
            ),
        }
        _population(clients, CODE, "live_code", result)
        _received(daemon, len(CODE))
        daemon.run_cycle()
        daemon.evaluate_gates()
        arms = arms_key(arm_pair_config(settings.snapshot().get("arms"), "speculative"))
        with SqlStore.open(result.database_url) as store:
            pinned = store.drift_references(arms)
            # Acceptance pins per category, each with its fallback-rate pin beside it.
            categories = {key for key in pinned if not key.endswith(FALLBACK_SUFFIX)}
            assert categories == {*SUITES, "live_code"}, pinned
            assert {fallback_key(c) for c in categories} <= set(pinned), pinned
            store.pin_drift_references({"live_chat": pinned["live_code"]}, datetime.now(UTC), arms)
        _population(clients, CHAT, "live_chat", result)
        _received(daemon, len(CODE) + len(CHAT))
        daemon.run_cycle()
        daemon.evaluate_gates()
        assert daemon.traffic is not None
        result.sampled = daemon.traffic.counts.get("sampled", 0)
        with SqlStore.open(result.database_url) as store:
            result.evaluations = store.evaluations(2)
    yield result


def _drift(evaluation: Evaluation) -> GateDecision:
    (drift,) = [d for d in evaluation.decisions if d.name == "drift"]
    return drift


def _components(drift: GateDecision) -> dict[str, GateDecision]:
    return {d.category: d for d in drift.components if d.category is not None}


class TestMirrorGateway:
    def test_production_answers_are_unaffected(self, soak: Soak) -> None:
        """Through nginx, mirror on and off side by side: the median latency ratio is
        within a generous bound and every greedy answer is the same on both ports."""
        ratio = soak.median_ratio()
        on, off = (statistics.median(soak.latency_s[m]) * 1000 for m in (True, False))
        print(  # shown with -s: the measured figure
            f"\nmirror on/off median latency ratio {ratio:.3f} ({on:.1f} vs {off:.1f} ms, "
            f"{len(soak.latency_s[True])} requests each)",
            file=sys.stderr,
        )
        assert ratio <= LATENCY_RATIO_BOUND
        assert set(soak.answers[True]) == set(CODE + CHAT)
        assert soak.answers[True] == soak.answers[False]

    def test_live_pairs_are_stored_without_text(self, soak: Soak) -> None:
        """Every mirrored request is a live pair named by its keyed hash, with no
        messages, no output text or token ids; the database holds none of the prompts."""
        assert soak.sampled == len(CODE) + len(CHAT)
        live = soak.rows(
            "SELECT p.pair_id, p.category, pr.prompt_id, pr.messages FROM pairs p "
            "JOIN prompts pr ON pr.id = p.prompt_ref WHERE p.source = 'live'"
        )
        expected = {
            prompt_hash(KEY.encode(), (Message(role="user", content=prompt),)): category
            for prompts, category in ((CODE, "live_code"), (CHAT, "live_chat"))
            for prompt in prompts
        }
        assert {row[2]: row[1] for row in live} == expected
        assert all(row[3] in ("[]", []) for row in live)
        generations = soak.rows(
            "SELECT g.text, g.token_ids, g.output_tokens FROM generations g "
            "JOIN pairs p ON p.pair_id = g.pair_id WHERE p.source = 'live'"
        )
        assert len(generations) == 2 * len(live)
        assert all(g[0] == "" and g[1] in ("[]", []) and g[2] > 0 for g in generations)
        stored = b"".join(p.read_bytes() for p in soak.database_dir.rglob("*.db*"))
        for prompt in CODE + CHAT:
            assert prompt.encode() not in stored, prompt

    def test_the_control_suites_stay_stable(self, soak: Soak) -> None:
        """The suites' drift checks neither warn nor fail, before or after the switch,
        and their mean acceptance length after it is within the relevant drop of before."""
        for evaluation in soak.evaluations:
            checks = _components(_drift(evaluation))
            for suite in SUITES:
                assert checks[suite].state not in (GateState.FAIL, GateState.WARN), checks[suite]
        first = soak.evaluations[0].at
        with SqlStore.open(soak.database_url) as store:
            control = [r for r in store.pairs(arm="speculative") if r.source == "control"]
        for suite in SUITES:
            lengths = {
                after: [
                    r.speculative.acceptance_length or 0.0
                    for r in control
                    if r.prompt.category == suite and (r.started_at > first) is after
                ]
                for after in (False, True)
            }
            before, after = (statistics.mean(lengths[phase]) for phase in (False, True))
            print(f"\n{suite}: acceptance length {before:.2f} → {after:.2f}", file=sys.stderr)
            assert after >= (1 - RELEVANT_DROP) * before, (suite, before, after)

    def test_after_the_switch_the_drift_names_the_traffic(self, soak: Soak) -> None:
        """Chat's acceptance drops with the suites held and the live mix moved: the drift
        gate WARNs (not FAIL) on the chat category and its evidence names the traffic."""
        before, after = (_drift(e) for e in soak.evaluations)
        assert "cause:" not in before.detail
        assert after.state is GateState.WARN, after.detail
        assert _components(after)["live_chat"].state is GateState.WARN
        assert "cause: traffic" in after.detail
        assert f"controls held ({', '.join(SUITES)})" in after.detail
        print(f"\n{after.detail}", file=sys.stderr)  # shown with -s: the evidence
